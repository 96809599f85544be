package roundtrip

import (
	"bytes"
	"context"
	"errors"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// errClosed stands for the Client's ErrClosed.
var errClosed = errors.New("closed")

// newRunner returns a Runner closed at the end of t.
func newRunner(t *testing.T) *Runner {
	closing, cancel := context.WithCancel(context.Background())
	r := New(closing, errClosed, nil, nil, nil)
	t.Cleanup(func() { cancel(); _ = r.Close(context.Background()) })
	return r
}

// idleWorkers returns how many workers wait for a call.
func (g *group) idleWorkers() int {
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
func runCall(g *group, f func()) {
	g.start()
	g.run(func() { defer g.done(); f() })
}

// A call runs in a worker that then waits for the next call (see
// group), instead of a goroutine created for it: calls one after
// another leave one worker.
func TestCallGroupReusesAnIdleWorker(t *testing.T) {
	g := newGroup(time.Minute)
	defer g.close(context.Background(), func() {})
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
	g := newGroup(time.Minute)
	defer g.close(context.Background(), func() {})
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
// (a channel's FIFO) would keep them all alive.
func TestCallGroupIdleWorkersRunOutUnderATrickle(t *testing.T) {
	const burst = 20
	g := newGroup(50 * time.Millisecond)
	defer g.close(context.Background(), func() {})
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
	g := newGroup(time.Millisecond)
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
	g.close(context.Background(), func() {})
}

// close ends the workers, once the calls have returned: none waits for a
// call afterwards.
func TestCallGroupCloseStopsItsWorkers(t *testing.T) {
	g := newGroup(time.Minute)
	for range 3 {
		runCall(g, func() {})
	}
	g.close(context.Background(), func() {})
	if n := g.idleWorkers(); n != 0 {
		t.Fatalf("%d workers wait after close", n)
	}
	if g.start() {
		t.Fatal("a closed group started a call")
	}
}

// Many calls at once all run at once; run never waits (if it did, the
// test fails rather than hangs).
func TestCallManyCallsRunAtOnce(t *testing.T) {
	g := newGroup(time.Minute)
	defer g.close(context.Background(), func() {})
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
	g := newGroup(time.Minute)
	for range 3 {
		runCall(g, func() {})
	}
	waitFor(t, "the workers to wait", func() bool { return g.idleWorkers() > 0 })
	start := time.Now()
	g.close(context.Background(), func() {})
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("close took %v: it waited for idle workers to run out", d)
	}
	if n := g.idleWorkers(); n != 0 {
		t.Fatalf("%d workers wait after close", n)
	}
}

// A goroutine started with go inherits its creator's profiler labels, so a
// call's goroutine was profiled under its caller's labels (pprof.Do). A
// worker, created by one caller, runs every later caller's calls: under
// each one's own labels.
func TestCallRunsUnderItsCallersProfilerLabels(t *testing.T) {
	r := newRunner(t)
	nothing := func(context.Context, redis.UniversalClient) ([]int64, error) { return nil, nil }
	pprof.Do(context.Background(), pprof.Labels("caller", "first"), func(ctx context.Context) {
		_, _, _ = r.Run(ctx, nothing, nil)
	})
	waitFor(t, "the worker to wait again", func() bool { return r.calls.idleWorkers() > 0 })
	release, running, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	pprof.Do(context.Background(), pprof.Labels("caller", "second"), func(ctx context.Context) {
		go func() {
			defer close(returned)
			_, _, _ = r.Run(ctx, func(context.Context, redis.UniversalClient) ([]int64, error) {
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
		if strings.Contains(rec, "(*group).work+") && strings.Contains(rec, "group_test.go") {
			if !strings.Contains(rec, `"caller":"second"`) {
				t.Fatalf("the second caller's call runs under other labels:\n%s", rec)
			}
			return
		}
	}
	t.Fatalf("no running call in the profile:\n%s", b.String())
}
