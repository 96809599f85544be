package redisync

import (
	"bytes"
	"context"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
)

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
func TestReview20CallRunsUnderItsCallersProfilerLabels(t *testing.T) {
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
		if strings.Contains(rec, "callGroup).work+") && strings.Contains(rec, "review20_test.go") {
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
func TestReview20CloseWhileCallsStartAndLateCallbacksCall(t *testing.T) {
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
func TestReview20ManyCallsRunAtOnce(t *testing.T) {
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
func TestReview20CloseEndsIdleWorkersAtOnce(t *testing.T) {
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
