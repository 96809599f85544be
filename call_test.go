package redisync

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// idleWorkers returns how many workers wait for a call.
func (g *callGroup) idleWorkers() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.idle)
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

// runCall runs f as a counted call of g.
func runCall(g *callGroup, f func()) {
	g.start()
	g.run(func() { defer g.done(); f() })
}

// A call runs in a worker that then waits for the next call (see
// callGroup), instead of a goroutine created for it: calls one after
// another leave one worker.
func TestCallGroupReusesAnIdleWorker(t *testing.T) {
	g := newCallGroup(time.Minute)
	defer g.close()
	for i := range 5 {
		ran := make(chan struct{})
		runCall(g, func() { close(ran) })
		<-ran
		waitFor(t, "the worker to wait again", func() bool { return g.idleWorkers() > 0 })
		if n := g.idleWorkers(); n != 1 {
			t.Fatalf("after call %d: %d idle workers, want 1", i+1, n)
		}
	}
}

// A call never waits for a busy worker: it gets a worker of its own.
func TestCallGroupRunsCallsAtOnce(t *testing.T) {
	g := newCallGroup(time.Minute)
	defer g.close()
	release, second := make(chan struct{}), make(chan struct{})
	runCall(g, func() { <-release })
	runCall(g, func() { close(second) })
	select {
	case <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("a call waited for a busy worker")
	}
	close(release)
}

// After a burst of calls at once, a trickle of calls goes to the worker
// idle last, and the others run out: a call to the worker idle longest
// (a channel's FIFO) would keep them all alive (review 20).
func TestCallGroupIdleWorkersRunOutUnderATrickle(t *testing.T) {
	const burst = 20
	g := newCallGroup(50 * time.Millisecond)
	defer g.close()
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(burst)
	for range burst {
		runCall(g, func() { started.Done(); <-release })
	}
	started.Wait()
	close(release)
	waitFor(t, "the burst's workers to wait", func() bool { return g.idleWorkers() == burst })
	// One call every millisecond: each of the burst's workers would get
	// one every 20 ms, well within their 50 ms, if calls went round.
	waitFor(t, "the idle workers to run out", func() bool {
		ran := make(chan struct{})
		runCall(g, func() { close(ran) })
		<-ran
		return g.idleWorkers() <= 2
	})
}

// A worker that runs out as a call is handed to it still runs the call:
// calls at about the idle time, from many goroutines, all run.
func TestCallGroupRunsEveryCallAsWorkersRunOut(t *testing.T) {
	g := newCallGroup(time.Millisecond)
	var ran, wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100 {
				ran.Add(1)
				runCall(g, ran.Done)
				time.Sleep(time.Duration((i+j)%3) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	done := make(chan struct{})
	go func() { ran.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a call handed to a worker never ran")
	}
	g.close()
}

// close ends the workers, once the calls have returned: none waits for a
// call afterwards.
func TestCallGroupCloseStopsItsWorkers(t *testing.T) {
	g := newCallGroup(time.Minute)
	for range 3 {
		runCall(g, func() {})
	}
	g.close()
	if n := g.idleWorkers(); n != 0 {
		t.Fatalf("%d workers wait after close", n)
	}
	if g.start() {
		t.Fatal("a closed group started a call")
	}
}

// Review 20's tests of the Client's worker goroutines (callGroup).

// workerGoroutines counts the goroutines in callGroup.work.
func workerGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "redisync.(*callGroup).work(")
}

// A goroutine started with go inherits its creator's profiler labels, so a
// call's goroutine was profiled under its caller's labels (pprof.Do). A
// worker, created by one caller, runs every later caller's calls: under
// each one's own labels.
func TestCallRunsUnderItsCallersProfilerLabels(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	nothing := func(context.Context) ([]int64, error) { return nil, nil }
	pprof.Do(context.Background(), pprof.Labels("caller", "first"), func(ctx context.Context) {
		_, _, _ = c.call(ctx, nothing, nil)
	})
	waitFor(t, "the worker to wait again", func() bool { return c.calls.idleWorkers() > 0 })
	release, running, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	pprof.Do(context.Background(), pprof.Labels("caller", "second"), func(ctx context.Context) {
		go func() {
			defer close(returned)
			_, _, _ = c.call(ctx, func(context.Context) ([]int64, error) {
				close(running)
				<-release
				return nil, nil
			}, nil)
		}()
	})
	<-running
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		t.Fatal(err)
	}
	close(release)
	<-returned
	for _, rec := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(rec, "callGroup).work+") && strings.Contains(rec, "call_test.go") {
			if !strings.Contains(rec, `"caller":"second"`) {
				t.Fatalf("the second caller's call runs under other labels:\n%s", rec)
			}
			return
		}
	}
	t.Fatalf("no running call in the profile:\n%s", b.String())
}

// Close, twice and at once, while calls start, are abandoned, and their
// late callbacks start clean-ups: no deadlock, no panic, no race, and no
// worker left.
func TestCallCloseWhileCallsStartAndLateCallbacksCall(t *testing.T) {
	for range 20 {
		_, rdb, _ := newMini(t)
		c, err := New(rdb)
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
				_, _, _ = c.call(ctx, func(ctx context.Context) ([]int64, error) {
					time.Sleep(time.Duration(i%7) * 10 * time.Millisecond) // a slow reply
					return nil, rdb.Ping(ctx).Err()
				}, func([]int64, error) {
					c.cleanup(context.Background(), func(ctx context.Context) ([]int64, error) {
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

// Many calls at once all run at once; run never waits (if it did, the
// test fails rather than hangs).
func TestCallManyCallsRunAtOnce(t *testing.T) {
	g := newCallGroup(time.Minute)
	defer g.close()
	release := make(chan struct{})
	defer close(release)
	var running sync.WaitGroup
	running.Add(100)
	for range 100 {
		g.start()
	}
	go func() {
		for range 100 {
			g.run(func() { defer g.done(); running.Done(); <-release })
		}
	}()
	all := make(chan struct{})
	go func() { running.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(5 * time.Second):
		t.Fatal("a call waited for a busy worker")
	}
}

// close ends idle workers at once, not when their idle time runs out.
func TestCallCloseEndsIdleWorkersAtOnce(t *testing.T) {
	g := newCallGroup(time.Minute)
	for range 3 {
		runCall(g, func() {})
	}
	waitFor(t, "the workers to wait", func() bool { return g.idleWorkers() > 0 })
	start := time.Now()
	g.close()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("close took %v: it waited for idle workers to run out", d)
	}
	if n := g.idleWorkers(); n != 0 {
		t.Fatalf("%d workers wait after close", n)
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
	_, _, _ = c.settle(ended, func(context.Context) (int64, error) {
		sent.Store(true)
		return 1, nil
	}, nil)
	eventually(t, 5*time.Second, "the release to be sent", sent.Load)
}
