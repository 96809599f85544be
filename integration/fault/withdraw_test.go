package fault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// A fair Lock that fails after it queued (ctx ended,
// or an error reply) withdraws: the queue (its records, and the count in
// the lock's hash) no longer holds it when the call returns.
func TestFailedFairLockWithdraws(t *testing.T) {
	t.Run("ctx-ends-during-an-attempt", func(t *testing.T) {
		// A fair Lock queued behind X is woken (an empty message, as a
		// release publishes) and its ctx ends while the attempt that
		// follows is on its way (20 ms each way through the proxy): it
		// must not leave its record in the queue. (It used to return the attempt's error without
		// withdrawing.) Its clean-up runs for at most 25 ms before Lock
		// returns, then in the background: the keys must be clean within
		// a second of the return.
		addr := redistest.Addr(t)
		rdb := redistest.NewClient(t, addr)
		px := redistest.NewProxy(t, addr)
		px.SetLatency(20 * time.Millisecond)
		name := redistest.Name(t)
		base := lockKey(name)
		x := must(newClient(t, addr).NewMutex(name))
		if err := x.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer x.Unlock(ctx)
		c := proxiedClient(t, px, nil, redisync.WithWaiterTimeout(30*time.Second), redisync.WithRecheck(time.Minute))
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 12 {
			m := must(c.NewMutex(name))
			actx, cancel := context.WithCancel(ctx)
			a := lockAsync(m, actx)
			eventually(t, 5*time.Second, "A queued and subscribed", func() bool {
				return rdb.LLen(ctx, lockQueueKey(base)).Val() == 1 && subscribers(t, rdb, name) == 1
			})
			owner := queueRecordsOn(t, rdb, base)[0].Ticket
			wake(t, rdb, name)                                            // A looks again: 20 ms to Redis, 20 ms back
			time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond) // lands the end of ctx in the attempt (not a wait for a condition)
			cancel()
			select {
			case r := <-a:
				if r.err == nil {
					t.Fatalf("trial %d: A's Lock returned nil after its ctx was cancelled", i)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("trial %d: A's Lock hangs after its ctx was cancelled", i)
			}
			eventually(t, time.Second, "A's record out of the queue", func() bool {
				st, _ := lockStateOn(t, rdb, base)
				return !ticketQueued(t, rdb, base, owner) && st.Queue == 0
			})
		}
	})

	t.Run("error-reply", func(t *testing.T) {
		addr := redistest.Addr(t)
		rdb := redistest.NewClient(t, addr)
		name := redistest.Name(t)
		base := lockKey(name)
		x := must(newClient(t, addr).NewMutex(name))
		if err := x.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer x.Unlock(ctx)

		// Once armed, the hook answers the Client's next call of a script
		// on the lock's queue (A's next look at the lock) with an error
		// reply, as Redis under maxmemory would; the calls after it go
		// through. (An empty message on A's grant channel, which wakes it
		// here, also has the Client pass a barging wake-up on, with a
		// script on the lock and its :bargers key.)
		var failNext atomic.Bool
		crdb := redistest.NewClient(t, addr)
		hook := hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			// An attempt (acquire.lua) names the ticket's refusal key; a
			// barging wake-up passed on (wake.lua) names the queue too.
			args := scriptArgs(cmd)
			if argContains(args, lockQueueKey(base)) && argContains(args, base+":released:") && failNext.CompareAndSwap(true, false) {
				err := replyError("OOM command not allowed when used memory > 'maxmemory'.")
				cmd.SetErr(err)
				return err
			}
			return next(ctx, cmd)
		})
		crdb.AddHook(hook)
		// A long heartbeat and recheck keep A quiet while it waits.
		c, err := redisync.New(crdb, withHook(hook), redisync.WithWaiterTimeout(30*time.Second), redisync.WithRecheck(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		m := must(c.NewMutex(name))

		a := lockAsync(m, ctx)
		eventually(t, 5*time.Second, "A queued and subscribed", func() bool {
			return rdb.LLen(ctx, lockQueueKey(base)).Val() == 1 && subscribers(t, rdb, name) == 1
		})
		owner := queueRecordsOn(t, rdb, base)[0].Ticket
		failNext.Store(true)
		// Wake A: its next look at the lock gets the error reply.
		var r result
		returned := make(chan struct{}, 1)
		go func() { r = <-a; returned <- struct{}{} }()
		wakeUntil(t, rdb, name, returned, "A's Lock to return")
		if r.err == nil || !strings.Contains(r.err.Error(), "OOM") {
			t.Fatalf("A's Lock returned %v, want the injected error reply", r.err)
		}
		st, _ := lockStateOn(t, rdb, base)
		if inQueue := ticketQueued(t, rdb, base, owner); inQueue || st.Queue != 0 {
			t.Fatalf("A's Lock returned %v but left A queued (its record in the queue: %v, queued by the lock's hash: %d)", r.err, inQueue, st.Queue)
		}
	})
}

// wakeUntil publishes empty messages on a lock's channel (each wakes one
// waiter per process) until done delivers, for at most 5 s.
func wakeUntil(t *testing.T, rdb *redis.Client, name string, done <-chan struct{}, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		wake(t, rdb, name)
		select {
		case <-done:
			return
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("waking waiters: no %s after 5 s", what)
		}
	}
}

// wake publishes an empty message on the lock's channel and on each of its
// grant channels, which makes one waiter of each Client look again.
func wake(t *testing.T, rdb *redis.Client, name string) {
	t.Helper()
	grants, err := rdb.PubSubChannels(ctx, channel(name)+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range append(grants, channel(name)) {
		if err := rdb.Publish(ctx, ch, "").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Unlock after a lost hold returns ErrLockLost and
// never removes the hold another owner took meanwhile.
func TestUnlockAfterLostKeepsOthersHold(t *testing.T) {
	const lease = 300 * time.Millisecond
	for _, tc := range []struct {
		name    string
		levels  int
		waitFor bool // wait for m's Lost before the Unlocks
	}{
		{"count1-lost-noticed", 1, true},
		{"count1-lost-unnoticed", 1, false},
		{"count2-lost-noticed", 2, true},
		{"count2-lost-unnoticed", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			rdb := redistest.NewClient(t, addr)
			name := redistest.Name(t)
			wd := lease
			if !tc.waitFor {
				wd = time.Minute // no renewal (which would notice) during the test
			}
			m := must(newClient(t, addr, redisync.WithCrashTimeout(wd)).NewMutex(name))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			hctx, cancel := m.HoldContext(ctx)
			defer cancel()
			for range tc.levels - 1 {
				if err := m.Lock(hctx); err != nil { // re-entered
					t.Fatal(err)
				}
			}
			lost := m.Lost()
			// The hold vanishes from Redis (as on expiry) and Y takes the lock.
			rdb.Del(ctx, lockKey(name))
			y := must(newClient(t, addr).NewMutex(name))
			if err := y.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			defer y.Unlock(ctx)
			yHold := rdb.HGetAll(ctx, lockKey(name)).Val()
			if tc.waitFor {
				select {
				case <-lost:
				case <-time.After(5 * time.Second):
					t.Fatal("m's Lost did not close after its hold vanished")
				}
			}
			for i := range tc.levels {
				err := m.Unlock(ctx)
				if i < tc.levels-1 && !tc.waitFor && err == nil {
					// An inner level's Unlock asks nothing of
					// Redis: a loss not noticed yet is reported
					// by the last level's.
					continue
				}
				if !errors.Is(err, redisync.ErrLockLost) {
					t.Errorf("Unlock %d of %d after the loss: %v, want ErrLockLost", i+1, tc.levels, err)
				}
			}
			if err := m.Unlock(ctx); !errors.Is(err, redisync.ErrNotHeld) {
				t.Errorf("one Unlock too many: %v, want ErrNotHeld", err)
			}
			if got := rdb.HGetAll(ctx, lockKey(name)).Val(); fmt.Sprint(got) != fmt.Sprint(yHold) {
				t.Fatalf("Y's hold %v became %v after m's Unlocks", yHold, got)
			}
			if isClosed(y.Lost()) {
				t.Fatal("Y's hold was lost")
			}
		})
	}
}
