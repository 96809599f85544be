package redisync

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// Close returns only once the calls that were waiting when it came have
// ended, having withdrawn from their queue: none of their commands reaches
// Redis after it, and no place of theirs is left queued for a release to
// hand the lock (or permits) to. The waiters' goroutines run late: their
// context holds each of them up for 300 ms once Close has woken them
// (until Close has returned, when Close does not wait for them).
func TestCloseWaitsForWaitersToWithdraw(t *testing.T) {
	const waiters = 64
	for _, kind := range []string{"mutex", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			holder := newClient(t, rdb)
			brdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), PoolSize: 4 * waiters})
			t.Cleanup(func() { _ = brdb.Close() })
			hook := &afterClose{}
			brdb.AddHook(hook)
			c, err := New(brdb, WithRecheck(time.Hour))
			if err != nil {
				t.Fatal(err)
			}

			var queue string
			var wait func(ctx context.Context) error
			switch kind {
			case "mutex":
				queue = schema.LockKeys("redisync", "close").Queue
				if err := holder.NewMutex("close").Lock(ctx); err != nil {
					t.Fatal(err)
				}
				wait = func(ctx context.Context) error { return c.NewMutex("close").Lock(ctx) }
			case "semaphore":
				queue = schema.SemaphoreKeys("redisync", "close").Queue
				if err := holder.NewSemaphore("close", 1).Acquire(ctx, 1); err != nil {
					t.Fatal(err)
				}
				wait = func(ctx context.Context) error { return c.NewSemaphore("close", 1).Acquire(ctx, 1) }
			}
			wctx := &slowCtx{Context: ctx, late: 300 * time.Millisecond, release: make(chan struct{})}
			errs := make(chan error, waiters)
			var wg sync.WaitGroup
			for range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- wait(wctx)
				}()
			}
			eventually(t, 30*time.Second, "every waiter to queue", func() bool {
				n, _ := mr.ZMembers(queue)
				return len(n) == waiters
			})

			wctx.armed.Store(true)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			hook.armed.Store(1)
			left, _ := mr.ZMembers(queue)
			close(wctx.release)
			wg.Wait()
			close(errs)
			for err := range errs {
				if !errors.Is(err, ErrClosed) {
					t.Errorf("a waiting call after Close: %v, want ErrClosed", err)
				}
			}
			if len(left) != 0 {
				t.Errorf("%d of %d waiters still queued when Close returned", len(left), waiters)
			}
			if n := hook.sent.Load(); n != 0 {
				t.Errorf("%d commands sent after Close returned", n)
			}
		})
	}
}
