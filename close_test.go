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
type afterClose struct{ armed, sent atomic.Int64 }

func (h *afterClose) DialHook(next redis.DialHook) redis.DialHook { return next }
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
func closingClient(t *testing.T, addr string, opts ...ClientOption) (*Client, *afterClose) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &afterClose{}
	rdb.AddHook(hook)
	c, err := New(rdb, opts...)
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
		m, _ := mr.ZMembers(queue)
		return len(m) == n
	})
	wctx.armed.Store(true)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	hook.armed.Store(1)
	left, _ := mr.ZMembers(queue)
	close(wctx.release)
	for range n {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("a waiting call after Close: %v, want ErrClosed", err)
		}
	}
	if len(left) != 0 {
		t.Errorf("%d of %d waiters still queued when Close returned", len(left), n)
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
				if err := holder.NewMutex("close").Lock(ctx); err != nil {
					t.Fatal(err)
				}
				closeWithLateWaiters(t, mr, c, hook, schema.LockKeys("redisync", "close").Queue, 64,
					func(ctx context.Context) error { return c.NewMutex("close").Lock(ctx) })
			case "semaphore":
				if err := holder.NewSemaphore("close", 1).Acquire(ctx, 1); err != nil {
					t.Fatal(err)
				}
				closeWithLateWaiters(t, mr, c, hook, schema.SemaphoreKeys("redisync", "close").Queue, 64,
					func(ctx context.Context) error { return c.NewSemaphore("close", 1).Acquire(ctx, 1) })
			}
		})
	}
}
