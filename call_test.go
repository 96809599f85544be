package redisync

import (
	"context"
	"errors"
	"testing"
	"time"
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
		"Mutex.Lock":       func() error { return c.NewMutex("m").Lock(ctx) },
		"Mutex.Lock barge": func() error { return c.NewMutex("m", Barging()).Lock(ctx) },
		"Semaphore":        func() error { return c.NewSemaphore("s", 2).Acquire(ctx, 1) },
		"RWMutex.RLock":    func() error { return c.NewRWMutex("rw").RLock(ctx) },
		"MultiMutex.Lock":  func() error { return c.NewMultiMutex([]string{"a", "b"}).Lock(ctx) },
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
func (failing) sleeping(*waitSet)                                      {}
func (failing) adopt(context.Context, string) (bool, error)            { return false, nil }
func (failing) changed() <-chan struct{}                               { return nil }
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
	m := c.NewMutex("m")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(passed); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if mr.Exists("redisync:lock:{m}") {
		t.Fatal("the lock is still held in Redis")
	}
	s := c.NewSemaphore("s", 2)
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(passed, 2); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if ok, err := c.NewSemaphore("s", 2).TryAcquire(ctx, 2); !ok || err != nil {
		t.Fatalf("TryAcquire after the release: %v, %v; want the 2 permits", ok, err)
	}
	mm := c.NewMultiMutex([]string{"a", "b"})
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mm.Unlock(passed); err != nil {
		t.Fatalf("MultiMutex.Unlock: %v", err)
	}
	if mr.Exists("redisync:lock:{a}") || mr.Exists("redisync:lock:{b}") {
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
	err := c.NewMutex("m").Lock(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock: %v, want context.DeadlineExceeded", err)
	}
	if ctx.Err() == nil {
		t.Fatal("Lock returned the deadline's error before the context said so")
	}
}

// A call runs in a worker that then waits for the next call (see
// callGroup), instead of a goroutine created for it.
func TestCallGroupReusesAnIdleWorker(t *testing.T) {
	g := newCallGroup()
	defer g.close()
	ran := make(chan int, 2)
	g.start()
	g.run(func() { defer g.done(); ran <- 1 })
	<-ran
	// The worker that ran the first call takes the next one.
	deadline := time.Now().Add(5 * time.Second)
	g.start()
	for taken := false; !taken; {
		select {
		case g.idle <- func() { defer g.done(); ran <- 2 }:
			taken = true
		default:
			if time.Now().After(deadline) {
				g.done() // the call counted for it never ran
				t.Fatal("no worker waits for a call after running one")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if n := <-ran; n != 2 {
		t.Fatalf("ran %d, want 2", n)
	}
}

// A call never waits for a busy worker: it gets a worker of its own.
func TestCallGroupRunsCallsAtOnce(t *testing.T) {
	g := newCallGroup()
	defer g.close()
	release, second := make(chan struct{}), make(chan struct{})
	g.start()
	g.run(func() { defer g.done(); <-release })
	g.start()
	g.run(func() { defer g.done(); close(second) })
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("a call waited for a busy worker")
	}
	close(release)
}

// close ends the workers, once the calls have returned: none waits for a
// call afterwards.
func TestCallGroupCloseStopsItsWorkers(t *testing.T) {
	g := newCallGroup()
	for range 3 {
		g.start()
		g.run(func() { defer g.done() })
	}
	g.close()
	select {
	case g.idle <- func() {}:
		t.Fatal("a worker outlived close")
	default:
	}
	if g.start() {
		t.Fatal("a closed group started a call")
	}
}
