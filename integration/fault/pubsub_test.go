package fault

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestSubscriberDroppedAtRelease drops the waiters' pub/sub connections
// (CLIENT KILL TYPE pubsub; or a reset of every connection through a
// proxy) and releases the lock at once, so its message is published while
// nobody is subscribed. Eight waiters on two Clients (recheck 1 s) block on
// a holder with the default 15 s lease. It fails unless the first waiter acquires
// within the recheck interval + 300 ms of the release and all eight within
// recheck + 1 s. It would fail if a waiter's sleep depended on the lost
// message (it would sleep until the 15 s lease ran out).
func TestSubscriberDroppedAtRelease(t *testing.T) {
	const recheck = time.Second
	for _, tc := range []struct {
		name  string
		proxy bool
	}{{"client-kill-pubsub", false}, {"proxy-reset", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Spawn(t)
			admin := redistest.NewClient(t, srv.Addr)
			name := redistest.Name(t)
			waitAddr := srv.Addr
			var px *redistest.Proxy
			if tc.proxy {
				px = redistest.NewProxy(t, srv.Addr)
				waitAddr = px.Addr
			}
			holder := must(newClient(t, srv.Addr).NewMutex(name))
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			const clients, perClient = 2, 4
			var started atomic.Int64
			acquired := make(chan result, clients*perClient)
			for range clients {
				c := newClient(t, waitAddr, redisync.WithRecheck(recheck))
				for range perClient {
					m := must(c.NewMutex(name))
					go func() {
						started.Add(1)
						err := m.Lock(lctx)
						at := time.Now()
						if err == nil {
							err = m.Unlock(lctx)
						}
						acquired <- result{err, at}
					}()
				}
			}
			// Every waiter queued (its first attempt done: a first
			// attempt that fails returns its error) and two
			// subscriptions.
			eventually(t, 5*time.Second, "8 waiters queued on 2 subscriptions", func() bool {
				return started.Load() == clients*perClient && subscribers(t, admin, name) == clients &&
					admin.LLen(ctx, "redisync:lock:{"+name+"}:waiting").Val() == clients*perClient
			})

			if tc.proxy {
				px.ResetAll()
			} else if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
				t.Fatal(err)
			}
			released := time.Now()
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			var first, last time.Duration
			for i := range clients * perClient {
				r := await(t, acquired, recheck+10*time.Second, "waiter")
				d := r.at.Sub(released)
				if i == 0 {
					first = d
				}
				last = max(last, d)
			}
			t.Logf("release to first acquire %v, to last %v (recheck %v)", first.Round(time.Millisecond), last.Round(time.Millisecond), recheck)
			if first > recheck+300*time.Millisecond {
				t.Errorf("first waiter acquired %v after the release, want <= recheck + 300ms", first)
			}
			if last > recheck+time.Second {
				t.Errorf("last waiter acquired %v after the release, want <= recheck + 1s", last)
			}
		})
	}
}

// TestGapRace makes a release land between a waiter's failed attempt and
// its subscription: the waiter's Client talks to Redis through a proxy that
// holds its SUBSCRIBE; the holder (15 s lease) releases while it is held,
// publishing to nobody. Recheck is 2 s.
//
//   - subscribe-late: the SUBSCRIBE goes through right after the release.
//     The waiter must look again once subscribed, and acquire well within
//     the recheck interval (< recheck/2); without that second look it would
//     sleep a whole recheck interval (or the 15 s lease).
//   - subscribe-lost: the SUBSCRIBE is never confirmed. The waiter must
//     still acquire within the recheck interval + 300 ms: joining waits for
//     the confirmation no longer than that.
//
// A barging waiter would miss the release; a fair one, handed the lock by
// the release, would miss the hand-off's message. Both run.
func TestGapRace(t *testing.T) {
	const recheck = 2 * time.Second
	for _, tc := range []struct {
		name  string
		late  bool
		bound time.Duration
	}{{"subscribe-late", true, recheck / 2}, {"subscribe-lost", false, recheck + 300*time.Millisecond}} {
		for _, barging := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/barging=%v", tc.name, barging), func(t *testing.T) {
				gapRace(t, tc.late, tc.bound, recheck, barging)
			})
		}
	}
}

// gapRace is one case of TestGapRace.
func gapRace(t *testing.T, late bool, bound, recheck time.Duration, barging bool) {
	var opts []redisync.Option
	if barging {
		opts = append(opts, redisync.Barging())
	}
	addr := redistest.Addr(t)
	px := redistest.NewProxy(t, addr)
	name := redistest.Name(t)
	holder := must(newClient(t, addr).NewMutex(name, opts...))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	held, letGo := px.HoldNext("$9\r\nsubscribe\r\n") // the command, not a name
	defer letGo()
	// A fair waiter's heartbeat (a second apart by default) would find
	// the hand-off too: a long one leaves it to the second look.
	waiter := must(newClient(t, px.Addr, redisync.WithRecheck(recheck), redisync.WithWaiterTimeout(30*time.Second)).NewMutex(name, opts...))
	done := lockAsync(waiter, ctx)
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter never sent SUBSCRIBE")
	}
	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if barging && l3bHeld(t, admin(t, addr), name) {
		t.Fatal("the lock is still held after Unlock")
	}
	if late {
		letGo()
	}
	r := await(t, done, recheck+10*time.Second, "waiter")
	gap := r.at.Sub(released)
	t.Logf("release to acquire: %v (recheck %v, bound %v)", gap.Round(time.Millisecond), recheck, bound)
	if gap > bound {
		t.Fatalf("waiter acquired %v after the release, want <= %v", gap, bound)
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// admin returns a plain go-redis client to addr.
func admin(t *testing.T, addr string) *redis.Client {
	t.Helper()
	return redistest.NewClient(t, addr)
}

// TestFairHandoffSurvivesSubscriberKill kills the fair waiters' pub/sub
// connection (CLIENT KILL TYPE pubsub) and releases the lock at once: the
// release script hands the lock to the queue's head and publishes the
// grant to nobody. The head must take its hold without that message, well
// before the recheck interval (10 s) or the hand-off lease (3 s) would let
// anyone look again: the re-subscription after the reconnect wakes every
// waiter, and the head's attempt finds its ticket holding the lock. The
// others follow in queue order, and nobody else holds meanwhile.
func TestFairHandoffSurvivesSubscriberKill(t *testing.T) {
	srv := redistest.Spawn(t)
	admin := redistest.NewClient(t, srv.Addr)
	name := redistest.Name(t)
	holder := must(newClient(t, srv.Addr).NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, srv.Addr, redisync.WithRecheck(10*time.Second))
	const n = 4
	order := make(chan int, n)
	done := make(chan result, n)
	for i := range n {
		m := must(c.NewMutex(name))
		go func() {
			err := m.Lock(ctx)
			at := time.Now()
			if err == nil {
				order <- i
				err = m.Unlock(ctx)
			}
			done <- result{err, at}
		}()
		// Queue them one by one, so that their order is known.
		eventually(t, 5*time.Second, "the waiter to queue", func() bool {
			return admin.LLen(ctx, lockKey(name)+":waiting").Val() == int64(i+1)
		})
	}
	eventually(t, 5*time.Second, "the waiters' subscription", func() bool { return subscribers(t, admin, name) == 1 })
	if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var last time.Duration
	for range n {
		r := await(t, done, 15*time.Second, "a waiter")
		last = max(last, r.at.Sub(released))
	}
	t.Logf("release to the last of %d waiters holding the lock: %v", n, last.Round(time.Millisecond))
	if last > 2*time.Second {
		t.Errorf("the last waiter held the lock %v after the release, want <= 2s (the hand-off was lost with its message)", last)
	}
	for want := range n {
		if got := <-order; got != want {
			t.Fatalf("waiter %d held the lock in place %d, want queue order", got, want)
		}
	}
}
