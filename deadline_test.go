package redisync

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/waiters"
)

// passedCtx is a context whose deadline has passed but which has not been
// told yet: on a loaded machine, the timer that ends a context fires late,
// and a reply can arrive in between.
type passedCtx struct{ context.Context }

func (passedCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A blocking call whose first attempt fails once its context's deadline
// has passed, though before the context is told, returns the deadline's
// error, not Redis's (here: every command fails). Seen in
// TestLockSet: a Lock called during a partition returned EOF 16 ms after
// its deadline.
func TestCallAfterTheDeadlineFailsWithTheDeadline(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	mr.SetError("ERR injected")
	ctx := passedCtx{context.Background()}
	calls := map[string]func() error{
		"Mutex.Lock":       func() error { return must(c.NewMutex("m")).Lock(ctx) },
		"Mutex.Lock barge": func() error { return must(c.NewMutex("m", Barging())).Lock(ctx) },
		"Semaphore":        func() error { return must(c.NewSemaphore("s", 2)).Acquire(ctx, 1) },
		"RWMutex.RLock":    func() error { return must(c.NewRWMutex("rw")).RLock(ctx) },
		"MultiMutex.Lock":  func() error { return must(c.NewMultiMutex([]string{"a", "b"})).Lock(ctx) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%v, want context.DeadlineExceeded", err)
			}
		})
	}
}

// failing is a contender whose every attempt fails with err.
type failing struct{ err error }

func (f failing) attempt(context.Context) (bool, time.Duration, error) { return false, 0, f.err }
func (failing) outlasts(error) bool                                    { return false }
func (failing) sleeping(*waiters.Set)                                  {}
func (failing) adopt(context.Context, string) (bool, error)            { return false, nil }
func (failing) address() string                                        { return "" }
func (failing) finish(context.Context, error)                          {}

// The wait loop that every blocking call shares fails with the deadline
// once it has passed, whatever failed in between (an attempt, a grant it
// could not take, the Client closing), as the checker of TestLockSet
// requires of every Lock call.
func TestBlockAfterTheDeadlineFailsWithTheDeadline(t *testing.T) {
	boom := errors.New("boom")
	if err := block(passedCtx{context.Background()}, nil, failing{boom}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v, want context.DeadlineExceeded", err)
	}
	if err := block(context.Background(), nil, failing{boom}); !errors.Is(err, boom) {
		t.Fatalf("%v, want boom: no deadline has passed", err)
	}
}

// A release is due whatever its context says: an Unlock (Release, Handoff)
// whose deadline has passed, though its context has not been told yet,
// still releases, as one whose context has ended does.
func TestReleaseAfterTheDeadlineStillReleases(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	passed := passedCtx{context.Background()}
	m := must(c.NewMutex("m"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(passed); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if lockHeld(t, mr, "redisync:lock:{m}") {
		t.Fatal("the lock is still held in Redis")
	}
	s := must(c.NewSemaphore("s", 2))
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(passed, 2); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if ok, err := must(c.NewSemaphore("s", 2)).TryAcquire(ctx, 2); !ok || err != nil {
		t.Fatalf("TryAcquire after the release: %v, %v; want the 2 permits", ok, err)
	}
	mm := must(c.NewMultiMutex([]string{"a", "b"}))
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mm.Unlock(passed); err != nil {
		t.Fatalf("MultiMutex.Unlock: %v", err)
	}
	if lockHeld(t, mr, "redisync:lock:{a}") || lockHeld(t, mr, "redisync:lock:{b}") {
		t.Fatal("a lock of the MultiMutex is still held in Redis")
	}
}

// lateCtx is a context whose deadline has passed and whose timer fires a
// little later, as on a loaded machine.
type lateCtx struct {
	context.Context
	done chan struct{}
}

func newLateCtx(late time.Duration) *lateCtx {
	c := &lateCtx{Context: context.Background(), done: make(chan struct{})}
	time.AfterFunc(late, func() { close(c.done) })
	return c
}

func (c *lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }
func (c *lateCtx) Done() <-chan struct{}       { return c.done }
func (c *lateCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// A call that fails with its deadline before the context's timer has fired
// waits for it, so that its caller finds ctx.Err() set: a caller that asks
// the context why a Lock failed gets the right answer.
func TestCallAfterTheDeadlineReturnsOnceTheContextSaysSo(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	mr.SetError("ERR injected")
	ctx := newLateCtx(5 * time.Millisecond)
	err := must(c.NewMutex("m")).Lock(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock: %v, want context.DeadlineExceeded", err)
	}
	if ctx.Err() == nil {
		t.Fatal("Lock returned the deadline's error before the context said so")
	}
}

// waitFor waits until cond holds, failing t after five seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
	}
}

// workerGoroutines counts the worker goroutines of internal/roundtrip.
func workerGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "roundtrip.(*group).work(")
}

// Close, twice and at once, while calls start, are abandoned, and their
// late callbacks start clean-ups: no deadlock, no panic, no race, and no
// worker left.
func TestCallCloseWhileCallsStartAndLateCallbacksCall(t *testing.T) {
	for range 20 {
		_, rdb, _ := newMini(t)
		c, err := New(rdb, withHooksOf(rdb))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Millisecond)
				defer cancel()
				_, _, _ = c.rt.Run(ctx, func(ctx context.Context, _ redis.UniversalClient) ([]int64, error) {
					time.Sleep(time.Duration(i%7) * 10 * time.Millisecond) // a slow reply
					return nil, rdb.Ping(ctx).Err()
				}, func([]int64, error) {
					c.rt.Cleanup(context.Background(), func(ctx context.Context, _ redis.UniversalClient) ([]int64, error) {
						return nil, rdb.Ping(ctx).Err()
					})
				})
			}()
		}
		done := make(chan struct{})
		for range 2 {
			go func() { _ = c.Close(); done <- struct{}{} }()
		}
		for range 2 {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Close hangs")
			}
		}
		wg.Wait()
		// A worker that has said Done may still be on its way out.
		waitFor(t, "no worker after Close", func() bool { return workerGoroutines() == 0 })
	}
}

// TestSettleSendsAfterItsContextEnded: a release is sent even when its
// context ends between the caller's look at it (releasing) and the
// sending: the release is due whatever ctx says.
func TestSettleSendsAfterItsContextEnded(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	var sent atomic.Bool
	_, _, _ = c.settle(ended, func(context.Context, redis.UniversalClient) (int64, error) {
		sent.Store(true)
		return 1, nil
	}, nil)
	eventually(t, 5*time.Second, "the release to be sent", sent.Load)
}

// An Unlock whose request is lost (blackholed) and whose ctx ends before
// its reply returns with its ctx's error, and its release is sent again
// until it applies: the lock is free long before its lease would run out.
func TestUnlockWhoseRequestIsLostStillReleases(t *testing.T) {
	for _, multi := range []bool{false, true} {
		t.Run(map[bool]string{false: "Mutex", true: "MultiMutex"}[multi], func(t *testing.T) {
			px := redistest.NewProxy(t, redistest.Addr(t))
			c := newClient(t, redistest.NewClient(t, px.Addr), WithCrashTimeout(time.Minute))
			other := newClient(t, redistest.Client(t))
			name := redistest.Name(t)
			names := []string{name + "-a", name + "-b"}
			var unlock func(context.Context) error
			var try func() bool
			if multi {
				m, om := must(c.NewMultiMutex(names)), must(other.NewMultiMutex(names))
				if err := m.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				unlock, try = m.Unlock, func() bool { ok, _ := om.TryLock(ctx); return ok }
			} else {
				m, om := must(c.NewMutex(names[0])), must(other.NewMutex(names[0]))
				if err := m.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				unlock, try = m.Unlock, func() bool { ok, _ := om.TryLock(ctx); return ok }
			}
			px.SetBlackholeRequests(true)
			uctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			err := unlock(uctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Unlock with its request lost: %v, want its ctx's error", err)
			}
			px.SetBlackholeRequests(false)
			px.ResetAll()
			eventually(t, 20*time.Second, "the lock free, its release sent again", try)
		})
	}
}
