package roundtrip

import (
	"context"
	"slices"
	"sync"
	"time"
)

// workerIdle is how long a worker goroutine of a Runner (see group)
// waits for its next round trip before it exits.
const workerIdle = 5 * time.Second

// group runs the round trips that go on in goroutines other than their
// callers', and counts them, so that Close can wait for them; it counts
// the calls that take something too (Runner.Enter). Once closed, it starts
// no more.
//
// The goroutines are workers that outlive a round trip: one that has run
// one waits up to idleFor for the next, which spares a goroutine's
// creation and the growth of its stack through go-redis on every round
// trip (12 % of the CPU of uncontended Lock and Unlock, when each round
// trip had a goroutine of its own). A round trip goes to the
// worker that became idle last, so that after a burst the workers it left
// idle run out while a trickle keeps one busy.
type group struct {
	idleFor   time.Duration
	stop      chan struct{} // closed once closed and drained: workers exit
	stopOnce  sync.Once
	afterOnce sync.Once // runs close's after
	workers   sync.WaitGroup

	mu      sync.Mutex
	n       int
	closed  bool
	drained chan struct{} // closed when closed and n is 0
	idle    []*worker     // waiting for a call, the last idle last
}

// worker is a worker goroutine's mailbox: a call taken off the idle list
// for it is put here, and it takes it however it stops waiting.
type worker struct{ calls chan func() }

func newGroup(idleFor time.Duration) *group {
	return &group{idleFor: idleFor, stop: make(chan struct{}), drained: make(chan struct{})}
}

// start counts a new call, unless the group is closed.
func (g *group) start() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

// run runs f, a counted call (see start), in the worker that became idle
// last, or in a new worker when none is idle. It never waits.
func (g *group) run(f func()) {
	g.mu.Lock()
	if k := len(g.idle) - 1; k >= 0 {
		w := g.idle[k]
		g.idle[k] = nil
		g.idle = g.idle[:k]
		g.mu.Unlock()
		w.calls <- f // its mailbox is empty: it holds one call at a time
		return
	}
	g.workers.Add(1) // before close waits for them: f is counted
	g.mu.Unlock()
	go g.work(&worker{calls: make(chan func(), 1)}, f)
}

// work is a worker's loop: it runs f, then each call put in its mailbox,
// until none came for idleFor or the group is closed and drained.
func (g *group) work(w *worker, f func()) {
	defer g.workers.Done()
	idle := time.NewTimer(g.idleFor)
	defer idle.Stop()
	for {
		f()
		f = nil // what the call holds goes with it
		g.mu.Lock()
		g.idle = append(g.idle, w)
		g.mu.Unlock()
		idle.Reset(g.idleFor)
		select {
		case f = <-w.calls:
			continue
		case <-idle.C:
		case <-g.stop:
		}
		if g.retire(w) {
			return
		}
		f = <-w.calls // a call took it off the idle list: it is on its way
	}
}

// retire takes w off the idle list, unless a call took it off first.
func (g *group) retire(w *worker) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := slices.Index(g.idle, w)
	if i < 0 {
		return false
	}
	g.idle = slices.Delete(g.idle, i, i+1)
	return true
}

// done counts a call out.
func (g *group) done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n--; g.n == 0 && g.closed {
		close(g.drained)
	}
}

// close starts no more calls, waits for those running to return, and
// then for the workers to exit; then it runs after, once. When ctx ends
// first, it returns ctx's error at once, and what is left (stopping the
// workers, after) is done when the last call returns.
func (g *group) close(ctx context.Context, after func()) error {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		if g.n == 0 {
			close(g.drained)
		}
	}
	g.mu.Unlock()
	finish := func() {
		g.stopOnce.Do(func() { close(g.stop) })
		g.workers.Wait()
		g.afterOnce.Do(after)
	}
	select {
	case <-g.drained:
		finish()
		return nil
	case <-ctx.Done():
		go func() {
			<-g.drained
			finish()
		}()
		return ctx.Err()
	}
}
