package redisync

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

// afterClose is a go-redis hook that counts the commands sent once armed.
type afterClose struct {
	passDial
	armed, sent atomic.Int64
}

func (h *afterClose) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() == 1 {
			h.sent.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}
func (h *afterClose) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() == 1 {
			h.sent.Add(1)
		}
		return next(ctx, cmd)
	}
}

// slowCtx is a context whose Err and Deadline, once armed, hold up the
// goroutine that calls them until released, or for late at most: the
// goroutine of a waiting call that runs late, after Close woke it.
type slowCtx struct {
	context.Context
	late    time.Duration
	armed   atomic.Bool
	held    atomic.Int64 // calls held up so far
	release chan struct{}
}

func (c *slowCtx) Err() error                  { c.hold(); return c.Context.Err() }
func (c *slowCtx) Deadline() (time.Time, bool) { c.hold(); return c.Context.Deadline() }

func (c *slowCtx) hold() {
	if c.armed.Load() {
		c.held.Add(1)
		t := time.NewTimer(c.late)
		defer t.Stop()
		select {
		case <-c.release:
		case <-t.C:
		}
	}
}

// closingClient returns a Client on the Redis at addr whose commands hook
// counts once armed.
func closingClient(t *testing.T, addr string, opts ...Option) (*Client, *afterClose) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &afterClose{}
	addHook(rdb, hook)
	c, err := New(rdb, append([]Option{withHooksOf(rdb)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c, hook
}

// closeWithLateWaiters runs n calls of wait on c, closes c once all n are
// queued in queue, their goroutines held up 300 ms each once Close has
// woken them (until Close has returned, when Close does not wait for
// them), and checks that every call failed with ErrClosed, that none was
// still queued when Close returned, and that c sent nothing after it.
func closeWithLateWaiters(t *testing.T, mr *miniredis.Miniredis, c *Client, hook *afterClose, queue string, n int, wait func(context.Context) error) {
	t.Helper()
	wctx := &slowCtx{Context: ctx, late: 300 * time.Millisecond, release: make(chan struct{})}
	errs := make(chan error, n)
	for range n {
		go func() { errs <- wait(wctx) }()
	}
	eventually(t, 30*time.Second, "every waiter to queue", func() bool {
		return queueSize(mr, queue) == n
	})
	wctx.armed.Store(true)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(1)
	left := queueSize(mr, queue)
	close(wctx.release)
	for range n {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("a waiting call after Close: %v, want ErrClosed", err)
		}
	}
	if left != 0 {
		t.Errorf("%d of %d waiters still queued when Close returned", left, n)
	}
	if sent := hook.sent.Load(); sent != 0 {
		t.Errorf("%d commands sent after Close returned", sent)
	}
}

// Close returns only once the calls that were waiting when it came have
// ended, having withdrawn from their queue: none of their commands reaches
// Redis after it, and no place of theirs is left queued for a release to
// hand the lock (or permits) to, even when their goroutines run late.
func TestCloseWaitsForWaitersToWithdraw(t *testing.T) {
	for _, kind := range []string{"mutex", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			holder := newClient(t, rdb)
			c, hook := closingClient(t, mr.Addr(), WithRecheck(time.Hour))
			switch kind {
			case "mutex":
				if err := must(holder.NewMutex("close")).Lock(ctx); err != nil {
					t.Fatal(err)
				}
				closeWithLateWaiters(t, mr, c, hook, schema.LockKeys("redisync", "close").Queue, 64,
					func(ctx context.Context) error { return must(c.NewMutex("close")).Lock(ctx) })
			case "semaphore":
				if err := must(holder.NewSemaphore("close", 1)).Acquire(ctx, 1); err != nil {
					t.Fatal(err)
				}
				closeWithLateWaiters(t, mr, c, hook, schema.SemaphoreKeys("redisync", "close").Queue, 64,
					func(ctx context.Context) error { return must(c.NewSemaphore("close", 1)).Acquire(ctx, 1) })
			}
		})
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

// Calls that could send commands during or after Close, each with a
// goroutine that runs late.

// A MultiMutex.Lock that holds its first name and waits for the second
// when Close comes gives the first back before Close returns: Close waits
// for the whole call, not only for its waiting Mutex.lock.
func TestCloseMultiMutexGivesBackBeforeCloseReturns(t *testing.T) {
	mr, rdb, _ := newMini(t)
	holder := newClient(t, rdb)
	c, hook := closingClient(t, mr.Addr(), WithRecheck(time.Hour))
	m := must(c.NewMultiMutex([]string{"x", "y"}))
	first, second := m.names[0], m.names[1]
	if err := must(holder.NewMutex(second)).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx := &slowCtx{Context: ctx, late: 300 * time.Millisecond, release: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- m.Lock(wctx) }()
	eventually(t, 5*time.Second, "the MultiMutex to queue for its second name", func() bool {
		return len(queuedTickets(t, mr, schema.LockKeys("redisync", second))) == 1
	})
	wctx.armed.Store(true)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(1)
	held := lockHeldAt(t, mr, schema.LockKeys("redisync", first), time.Now())
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
func TestCloseTryLockRacingCloseSendsNothingAfterIt(t *testing.T) {
	mr, _, _ := newMini(t)
	c, hook := closingClient(t, mr.Addr())
	m := must(c.NewMutex("t"))
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
	if lockStateOf(t, mr, schema.LockKeys("redisync", "t")).Token != 0 {
		t.Error("a fencing token was minted: the closed Client took the lock")
	}
}

// A Lock counted in before Close whose first attempt comes only once Close
// has begun does not send it: a closing Client takes nothing (no fencing
// token is minted for it) while Close gives every hold back.
func TestCloseLockAttemptNotSentOnceCloseBegan(t *testing.T) {
	mr, _, _ := newMini(t)
	c, _ := closingClient(t, mr.Addr())
	wctx := &nthSlowCtx{Context: ctx, from: 2}
	done := make(chan error, 1)
	go func() { done <- must(c.NewMutex("f")).Lock(wctx) }()
	eventually(t, 5*time.Second, "Lock to be held up before its attempt", func() bool { return wctx.calls.Load() >= 2 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Lock: %v, want ErrClosed", err)
	}
	if tok := lockStateOf(t, mr, schema.LockKeys("redisync", "f")).Token; tok != 0 {
		t.Errorf("a fencing token was minted during Close (%d): the closing Client took the lock", tok)
	}
}

// RWMutex.Lock and RLock and Election.Campaign wait through
// Semaphore.acquire and Mutex.lock: Close waits for them to withdraw too.
func TestCloseWaitsForOtherPrimitives(t *testing.T) {
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
				if err := must(holder.NewRWMutex("close")).Lock(ctx); err != nil {
					t.Fatal(err)
				}
				wait = func(ctx context.Context) error { return must(c.NewRWMutex("close")).Lock(ctx) }
				if kind == "rwmutex-r" {
					wait = func(ctx context.Context) error { return must(c.NewRWMutex("close")).RLock(ctx) }
				}
			case "election":
				queue = schema.ElectionKeys("redisync", "close").Queue
				if err := must(holder.NewElection("close")).Campaign(ctx, "h"); err != nil {
					t.Fatal(err)
				}
				wait = func(ctx context.Context) error { return must(c.NewElection("close")).Campaign(ctx, "w") }
			}
			closeWithLateWaiters(t, mr, c, hook, queue, 32, wait)
		})
	}
}

// Close loses every hold: its context's cause is ErrLockLost. An Unlock
// that runs once the Client is closing, before the watchdog drops the
// holds, forgets the hold as released instead: the cause is ErrReleased.
func TestCloseUnlockDuringCloseEndsAsReleased(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		t.Fatal(err)
	}
	m := must(c.NewMutex("job"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	c.close() // Close has begun: the Client is closed, the watchdog not stopped yet
	if err := m.Unlock(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Unlock: %v, want ErrClosed", err)
	}
	_ = c.Close()
	mr.Del("redisync:lock:{job}") // see TestCloseUnlockDuringCloseLeavesTheLock
	<-hctx.Done()
	if !errors.Is(context.Cause(hctx), ErrLockLost) {
		t.Fatalf("closed: cause %v, want ErrLockLost (holds are lost with the Client)", context.Cause(hctx))
	}
}

// The same Unlock, which removes the hold from the watchdog without
// sending its release, does not leave the lock held for its lease: Close
// still releases every hold.
func TestCloseUnlockDuringCloseLeavesTheLock(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		t.Fatal(err)
	}
	m := must(c.NewMutex("job"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	c.close()
	_ = m.Unlock(ctx)
	_ = c.Close()
	if lockHeldAt(t, mr, schema.LockKeys("redisync", "job"), time.Now()) {
		mr.Del("redisync:lock:{job}")
		t.Fatal("after Close, the lock is still in Redis: neither Unlock nor Close released it")
	}
}

// Close does not wait without bound for the observer (or the log handler)
// to take every queued event: one that blocks (an exporter stuck on the
// network, a log sink that stalls) would hang Close for good, and a slow
// one delay it by up to the queue's 1,024 events times its latency, past
// the 2 s that Close otherwise allows its releases.
func TestCloseDoesNotWaitForABlockedObserver(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &recorder{}
	rec.gate.Lock()
	c, err := New(rdb, withHooksOf(rdb), WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	m := must(c.NewMutex("blocked-close"))
	if err := m.Lock(ctx); err != nil { // an event the observer blocks on
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeTimeout + 2*time.Second):
		t.Error("Close waits for an observer that blocks")
	}
	rec.gate.Unlock()
	<-closed
}
