package fault

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// Suspected case (a): a fair Lock that fails after it queued (ctx ended,
// or an error reply) withdraws: the queue and the waiters' records no
// longer hold it when the call returns.
func TestFindingAFailedFairLockWithdraws(t *testing.T) {
	t.Run("ctx-ends-behind-sibling-call", func(t *testing.T) {
		addr := redistest.Addr(t)
		rdb := redistest.NewClient(t, addr)
		px := redistest.NewProxy(t, addr)
		name := redistest.Name(t)
		base := lockKey(name)
		x := newClient(t, addr).NewMutex(name, redisync.Fair())
		if err := x.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer x.Unlock(ctx)

		var calls atomic.Int64   // script calls answered
		var w2Owner atomic.Value // string
		w2Calls := make(chan struct{}, 100)
		hook := hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			err := next(ctx, cmd)
			if scriptArgs(cmd) != nil {
				calls.Add(1)
			}
			if o, _ := w2Owner.Load().(string); o != "" && argContains(scriptArgs(cmd), o) {
				select {
				case w2Calls <- struct{}{}:
				default:
				}
			}
			return err
		})
		// A long heartbeat and recheck keep the waiters quiet while they wait.
		c := proxiedClient(t, px, hook, redisync.Fair(),
			redisync.WithHeartbeat(30*time.Second), redisync.WithRecheck(time.Minute))
		m, w2 := c.NewMutex(name), c.NewMutex(name)

		// A (on m) then W2 queue behind X, in that order.
		actx, cancelA := context.WithCancel(ctx)
		defer cancelA()
		a := lockAsync(m, actx)
		eventually(t, 5*time.Second, "A queued and subscribed", func() bool {
			return rdb.ZCard(ctx, base+":queue").Val() == 1 && subscribers(t, rdb, name) == 1
		})
		// A looks again once subscribed; no call of A may be in flight
		// when the sibling call below is held.
		waitUpTo(time.Second, func() bool { return calls.Load() >= 2 })
		n := calls.Load()
		w2ctx, cancelW2 := context.WithCancel(ctx)
		defer cancelW2()
		w2Done := lockAsync(w2, w2ctx)
		eventually(t, 5*time.Second, "W2 queued", func() bool {
			return rdb.ZCard(ctx, base+":queue").Val() == 2 && calls.Load() > n
		})
		q := rdb.ZRange(ctx, base+":queue", 0, -1).Val()
		aOwner := q[0]
		w2Owner.Store(q[1])

		// A sibling call on m holds m's turn to talk to Redis: its
		// request (the next command on the lock) is held on the wire.
		held, release := px.HoldNext(strings.ToLower(base))
		defer release()
		sib := make(chan error, 1)
		go func() { _, err := m.TryLock(ctx); sib <- err }()
		select {
		case <-held:
		case <-time.After(5 * time.Second):
			t.Fatal("the sibling TryLock was not sent")
		}
		// Wake waiters (empty messages wake one waiter per process, in
		// arrival order) until W2 looks again: A was woken first and is
		// now behind the sibling call.
		for len(w2Calls) > 0 {
			<-w2Calls
		}
		wakeUntil(t, rdb, name, w2Calls, "W2 to look again")
		cancelA()
		var r result
		select {
		case r = <-a:
		case <-time.After(time.Second):
			// A correct withdrawal may wait for the sibling call.
			release()
			select {
			case r = <-a:
			case <-time.After(10 * time.Second):
				t.Fatal("A's Lock hangs after its ctx was cancelled")
			}
		}
		if r.err == nil {
			t.Fatal("A's Lock returned nil after its ctx was cancelled")
		}
		inQueue := rdb.ZScore(ctx, base+":queue", aOwner).Err() == nil
		inWaiters := rdb.HExists(ctx, base+":waiters", aOwner).Val()
		release()
		<-sib
		if inQueue || inWaiters {
			t.Fatalf("A's Lock returned %v but left A queued (in the queue: %v, in the waiters' records: %v)", r.err, inQueue, inWaiters)
		}
		cancelW2()
		<-w2Done
	})

	t.Run("error-reply", func(t *testing.T) {
		addr := redistest.Addr(t)
		rdb := redistest.NewClient(t, addr)
		name := redistest.Name(t)
		base := lockKey(name)
		x := newClient(t, addr).NewMutex(name, redisync.Fair())
		if err := x.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer x.Unlock(ctx)

		// Once armed, the hook answers the Client's next script call (A's
		// next look at the lock) with an error reply, as Redis under
		// maxmemory would; the calls after it go through.
		var failNext atomic.Bool
		crdb := redistest.NewClient(t, addr)
		crdb.AddHook(hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if scriptArgs(cmd) != nil && failNext.CompareAndSwap(true, false) {
				err := replyError("OOM command not allowed when used memory > 'maxmemory'.")
				cmd.SetErr(err)
				return err
			}
			return next(ctx, cmd)
		}))
		// A long heartbeat and recheck keep A quiet while it waits.
		c := redisync.New(crdb, redisync.Fair(), redisync.WithHeartbeat(30*time.Second), redisync.WithRecheck(time.Minute))
		t.Cleanup(func() { _ = c.Close() })
		m := c.NewMutex(name)

		a := lockAsync(m, ctx)
		eventually(t, 5*time.Second, "A queued and subscribed", func() bool {
			return rdb.ZCard(ctx, base+":queue").Val() == 1 && subscribers(t, rdb, name) == 1
		})
		owner := rdb.ZRange(ctx, base+":queue", 0, 0).Val()[0]
		failNext.Store(true)
		// Wake A: its next look at the lock gets the error reply.
		var r result
		returned := make(chan struct{}, 1)
		go func() { r = <-a; returned <- struct{}{} }()
		wakeUntil(t, rdb, name, returned, "A's Lock to return")
		if r.err == nil || !strings.Contains(r.err.Error(), "OOM") {
			t.Fatalf("A's Lock returned %v, want the injected error reply", r.err)
		}
		inQueue := rdb.ZScore(ctx, base+":queue", owner).Err() == nil
		inWaiters := rdb.HExists(ctx, base+":waiters", owner).Val()
		if inQueue || inWaiters {
			t.Fatalf("A's Lock returned %v but left A queued (in the queue: %v, in the waiters' records: %v)", r.err, inQueue, inWaiters)
		}
	})
}

// wakeUntil publishes empty messages on a lock's channel (each wakes one
// waiter per process) until done delivers, for at most 5 s.
func wakeUntil(t *testing.T, rdb *redis.Client, name string, done <-chan struct{}, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := rdb.Publish(ctx, channel(name), "").Err(); err != nil {
			t.Fatal(err)
		}
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

// Suspected case (b): Unlock after a lost hold returns ErrLockLost and
// never removes the hold another owner took meanwhile.
func TestFindingBUnlockAfterLostKeepsOthersHold(t *testing.T) {
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
			m := newClient(t, addr, redisync.WithWatchdogLease(wd)).NewMutex(name)
			for range tc.levels {
				if err := m.Lock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			lost := m.Lost()
			// The hold vanishes from Redis (as on expiry) and Y takes the lock.
			rdb.Del(ctx, lockKey(name))
			y := newClient(t, addr).NewMutex(name)
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
				if err := m.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
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
