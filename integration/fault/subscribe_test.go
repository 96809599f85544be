package fault

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestStalledSubscribeLeavesNoWaiterDeaf: a
// SUBSCRIBE that stalls past the linger period (2 s) must not leave its
// channel broken for later waiters of the same Client.
//
// A waiter's Client talks to Redis through a proxy that holds its first
// SUBSCRIBE; the waiter gives up (300 ms deadline) while it is held. Its
// Client unsubscribes the idle channel once the linger period is over (the
// UNSUBSCRIBE queues behind the stalled SUBSCRIBE); then the stall ends
// and Redis runs both. Later, another waiter of the same Client (recheck
// 10 s, so that only a message can wake it in time) blocks on the lock and
// the holder releases it: the later waiter must hold the lock within 1 s
// of the release. Where this does not hold, the stalled SUBSCRIBE's
// in-flight count is never settled, the channel never counts as
// subscribed again, and the later waiter sleeps until its recheck.
func TestStalledSubscribeLeavesNoWaiterDeaf(t *testing.T) {
	const recheck = 10 * time.Second
	addr := redistest.Spawn(t).Addr // of its own: the test counts its commands
	admin := redistest.NewClient(t, addr)
	px := redistest.NewProxy(t, addr)
	name := redistest.Name(t)
	holder := must(newClient(t, addr).NewMutex(name, redisync.Barging())) // only a message meets the bound: no heartbeat
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, px.Addr, redisync.WithRecheck(recheck))

	held, letGo := px.HoldNext("$9\r\nsubscribe\r\n") // the command, not a name
	defer letGo()
	unsubSent := px.Watch("unsubscribe", true)
	first := must(c.NewMutex(name, redisync.Barging()))
	fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := first.Lock(fctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first waiter: %v, want its deadline", err)
	}
	select {
	case <-held:
	default:
		t.Fatal("the first waiter's SUBSCRIBE was not held")
	}
	gaveUp := time.Now()
	// Keep the SUBSCRIBE stalled until the Client unsubscribes the idle
	// channel (behind it), or for the linger period and 2 s more if it
	// never does.
	unsubscribed := false
	select {
	case <-unsubSent:
		unsubscribed = true
	case <-time.After(4 * time.Second):
	}
	t.Logf("gave up to UNSUBSCRIBE sent: %v (sent: %v)", time.Since(gaveUp).Round(time.Millisecond), unsubscribed)

	// The stall ends: Redis runs what was held.
	before := cmdCalls(t, admin)
	letGo()
	eventually(t, 5*time.Second, "Redis to run the stalled commands", func() bool {
		now := cmdCalls(t, admin)
		return now["subscribe"] > before["subscribe"] && (!unsubscribed || now["unsubscribe"] > before["unsubscribe"])
	})

	later := must(c.NewMutex(name, redisync.Barging()))
	lctx, cancel := context.WithTimeout(ctx, 2*recheck)
	defer cancel()
	done := lockAsync(later, lctx)
	eventually(t, 5*time.Second, "the later waiter to subscribe", func() bool { return subscribers(t, admin, name) == 1 })
	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		gap := r.at.Sub(released)
		t.Logf("release to the later waiter holding the lock: %v (recheck %v)", gap.Round(time.Millisecond), recheck)
		if gap > time.Second {
			t.Errorf("the later waiter held the lock %v after the release, want <= 1s", gap.Round(time.Millisecond))
		}
		if err := later.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("the later waiter did not hold the lock 3s after the release (want <= 1s; its recheck is %v): it was not woken", recheck)
		cancel()
		<-done
	}
}

// TestReconnectSubscribesEachChannelOnce checks "a double
// SUBSCRIBE on reconnect": when a Client's pub/sub connection is reset,
// the channel it had subscribed must be subscribed again once, not once by
// go-redis (which subscribes a PubSub's channels again when it redials)
// and once more by the Client.
//
// Three waiters of one Client (through a proxy) block on a lock held by a
// direct Client, on a Redis of the test's own. Every connection through
// the proxy is reset, either once the channel is subscribed (established)
// or while the first SUBSCRIBE is held in the proxy (in-flight, so that
// it never reaches Redis). Once Redis shows the channel subscribed again,
// the lock is released and every waiter takes it in turn; then Redis must
// have run exactly one SUBSCRIBE since the reset (INFO commandstats).
func TestReconnectSubscribesEachChannelOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight bool
	}{{"established", false}, {"in-flight", true}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Spawn(t).Addr // of its own: the test counts its commands
			admin := redistest.NewClient(t, addr)
			px := redistest.NewProxy(t, addr)
			name := redistest.Name(t)
			holder := must(newClient(t, addr).NewMutex(name))
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			var held <-chan struct{}
			letGo := func() {}
			if tc.inFlight {
				held, letGo = px.HoldNext("$9\r\nsubscribe\r\n")
				defer letGo()
			}
			c := newClient(t, px.Addr, redisync.WithRecheck(time.Minute))
			lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			done := make(chan error, 3)
			for range 3 {
				m := must(c.NewMutex(name))
				go func() {
					err := m.Lock(lctx)
					if err == nil {
						err = m.Unlock(ctx)
					}
					done <- err
				}()
			}
			if tc.inFlight {
				select {
				case <-held:
				case <-time.After(5 * time.Second):
					t.Fatal("the waiters never sent SUBSCRIBE")
				}
			} else {
				eventually(t, 5*time.Second, "the waiters to subscribe", func() bool { return subscribers(t, admin, name) == 1 })
			}
			before := cmdCalls(t, admin)["subscribe"]
			px.ResetAll()
			letGo() // the held SUBSCRIBE goes to a closed connection
			eventually(t, 10*time.Second, "the channel to be subscribed again", func() bool { return subscribers(t, admin, name) == 1 })

			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			timeout := time.After(10 * time.Second)
			for i := range 3 {
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-timeout:
					t.Fatalf("only %d of 3 waiters held the lock 10s after the release", i)
				}
			}
			if n := cmdCalls(t, admin)["subscribe"] - before; n != 1 {
				t.Errorf("Redis ran %d SUBSCRIBE commands for the one channel since the reset, want 1", n)
			} else {
				t.Logf("Redis ran 1 SUBSCRIBE since the reset")
			}
		})
	}
}
