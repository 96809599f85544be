package fault

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// A cancelled Lock must never remove the hold that another
// goroutine's Lock on the same (fair) Mutex value was given.
func TestSiblingWithdrawKeepsHold(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	px := redistest.NewProxy(t, addr)
	name := redistest.Name(t)
	queue := queueKey(name)

	x := must(newClient(t, addr).NewMutex(name))
	if err := x.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	// Count m's script calls that got a reply. A long heartbeat and
	// recheck keep m quiet while its calls wait.
	var calls atomic.Int64
	hook := hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if scriptArgs(cmd) != nil {
			calls.Add(1)
		}
		return err
	})
	m := must(proxiedClient(t, px, hook).NewMutex(name,
		redisync.WithWaiterTimeout(30*time.Second), redisync.WithRecheck(time.Minute)))

	// Goroutine A waits on m, queued behind X.
	a := lockAsync(m, ctx)
	eventually(t, 5*time.Second, "A queued and subscribed", func() bool {
		return rdb.LLen(ctx, queue).Val() == 1 && subscribers(t, rdb, name) == 1
	})
	// A looks again once subscribed (so a later call joins at once).
	waitUpTo(time.Second, func() bool { return calls.Load() >= 2 })
	// Goroutine B waits on the same value m.
	n := calls.Load()
	bctx, cancelB := context.WithCancel(ctx)
	defer cancelB()
	b := lockAsync(m, bctx)
	eventually(t, 5*time.Second, "B's Lock to ask Redis", func() bool { return calls.Load() > n })

	// B is cancelled; its withdrawal (its next command on the lock) is
	// held back on the wire while X hands the lock to m (the head of the
	// queue) and A takes it.
	held, release := px.HoldNext(strings.ToLower(lockKey(name)))
	defer release()
	cancelB()
	select {
	case <-held:
	case <-time.After(time.Second):
		t.Log("B's cancelled Lock sent nothing on the lock: the race could not be staged")
		release()
	}
	if err := x.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var ra result
	select {
	case ra = <-a:
		if ra.err != nil {
			t.Fatalf("A's Lock: %v", ra.err)
		}
	case <-time.After(time.Second):
		// A may also wait for B's withdrawal to be done.
	}
	release()
	select {
	case r := <-b:
		t.Logf("B's Lock returned %v", r.err)
	case <-time.After(5 * time.Second):
		t.Fatal("B's Lock hangs")
	}
	if ra.at.IsZero() {
		await(t, a, 5*time.Second, "A's Lock")
	}
	lost := m.Lost()

	y := must(newClient(t, addr).NewMutex(name))
	ok, err := y.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		defer y.Unlock(ctx)
	}
	if ok && !isClosed(lost) {
		t.Fatalf("A's Lock returned nil and A's Lost is open, yet another owner took the lock: " +
			"B's cancelled Lock on the same Mutex value removed A's hold from Redis")
	}
	_ = m.Unlock(ctx)
}
