package redisync

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Review 26 (of 1713ea8, Close waiting for the waiters to withdraw): the
// calls it found sending commands during or after Close, each with a
// goroutine that runs late.

// A MultiMutex.Lock that holds its first name and waits for the second
// when Close comes gives the first back before Close returns: Close waits
// for the whole call, not only for its waiting Mutex.lock.
func TestReview26MultiMutexGivesBackBeforeCloseReturns(t *testing.T) {
	mr, rdb, _ := newMini(t)
	holder := newClient(t, rdb)
	c, hook := closingClient(t, mr.Addr(), WithRecheck(time.Hour))
	m := c.NewMultiMutex([]string{"x", "y"})
	first, second := m.names[0], m.names[1]
	if err := holder.NewMutex(second).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx := &slowCtx{Context: ctx, late: 300 * time.Millisecond, release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- m.Lock(wctx) }()
	eventually(t, 5*time.Second, "the MultiMutex to queue for its second name", func() bool {
		n, _ := mr.ZMembers(schema.LockKeys("redisync", second).Queue)
		return len(n) == 1
	})
	wctx.armed.Store(true)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(1)
	held := mr.Exists(schema.LockKeys("redisync", first).Hash)
	close(wctx.release)
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Lock: %v, want ErrClosed", err)
	}
	if held {
		t.Errorf("the first name, %q, was still held when Close returned", first)
	}
	if n := hook.sent.Load(); n != 0 {
		t.Errorf("%d commands sent after Close returned", n)
	}
}

// A TryLock whose check passed before Close, and whose goroutine then runs
// late, sends nothing: it counts itself in, or fails with ErrClosed.
func TestReview26TryLockRacingCloseSendsNothingAfterIt(t *testing.T) {
	mr, _, _ := newMini(t)
	c, hook := closingClient(t, mr.Addr())
	m := c.NewMutex("t")
	wctx := &slowCtx{Context: ctx, late: 300 * time.Millisecond, release: make(chan struct{})}
	wctx.armed.Store(true)
	done := make(chan error, 1)
	go func() { _, err := m.TryLock(wctx); done <- err }()
	eventually(t, 5*time.Second, "TryLock's goroutine to be held up", func() bool { return wctx.held.Load() > 0 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(1)
	close(wctx.release)
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("TryLock: %v, want ErrClosed", err)
	}
	if n := hook.sent.Load(); n != 0 {
		t.Errorf("%d commands sent after Close returned", n)
	}
	if mr.Exists(schema.LockKeys("redisync", "t").Token) {
		t.Error("a fencing token was minted: the closed Client took the lock")
	}
}

// nthSlowCtx holds up its caller in Err from the n-th call on, for 300 ms
// at most.
type nthSlowCtx struct {
	context.Context
	calls atomic.Int64
	from  int64
}

func (c *nthSlowCtx) Err() error {
	if c.calls.Add(1) >= c.from {
		time.Sleep(300 * time.Millisecond) // the goroutine runs late
	}
	return c.Context.Err()
}

// A Lock counted in before Close whose first attempt comes only once Close
// has begun does not send it: a closing Client takes nothing (no fencing
// token is minted for it) while Close gives every hold back.
func TestReview26LockAttemptNotSentOnceCloseBegan(t *testing.T) {
	mr, _, _ := newMini(t)
	c, _ := closingClient(t, mr.Addr())
	wctx := &nthSlowCtx{Context: ctx, from: 2}
	done := make(chan error, 1)
	go func() { done <- c.NewMutex("f").Lock(wctx) }()
	eventually(t, 5*time.Second, "Lock to be held up before its attempt", func() bool { return wctx.calls.Load() >= 2 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Lock: %v, want ErrClosed", err)
	}
	if tok, err := mr.Get(schema.LockKeys("redisync", "f").Token); err == nil {
		t.Errorf("a fencing token was minted during Close (%s): the closing Client took the lock", tok)
	}
}

// RWMutex.Lock and RLock and Election.Campaign wait through
// Semaphore.acquire and Mutex.lock: Close waits for them to withdraw too.
func TestReview26CloseWaitsForOtherPrimitives(t *testing.T) {
	for _, kind := range []string{"rwmutex-w", "rwmutex-r", "election"} {
		t.Run(kind, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			holder := newClient(t, rdb)
			c, hook := closingClient(t, mr.Addr(), WithRecheck(time.Hour))
			var queue string
			var wait func(ctx context.Context) error
			switch kind {
			case "rwmutex-w", "rwmutex-r":
				queue = schema.RWMutexKeys("redisync", "close").Queue
				if err := holder.NewRWMutex("close").Lock(ctx); err != nil {
					t.Fatal(err)
				}
				wait = func(ctx context.Context) error { return c.NewRWMutex("close").Lock(ctx) }
				if kind == "rwmutex-r" {
					wait = func(ctx context.Context) error { return c.NewRWMutex("close").RLock(ctx) }
				}
			case "election":
				queue = schema.ElectionKeys("redisync", "close").Queue
				if err := holder.NewElection("close").Campaign(ctx, "h"); err != nil {
					t.Fatal(err)
				}
				wait = func(ctx context.Context) error { return c.NewElection("close").Campaign(ctx, "w") }
			}
			closeWithLateWaiters(t, mr, c, hook, queue, 32, wait)
		})
	}
}
