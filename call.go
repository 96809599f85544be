package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cleanupTimeout bounds the clean-up a call does after its context ended,
// and a release sent after the caller's context ended.
const cleanupTimeout = 5 * time.Second

// cleanupWait is how long a call that ends without success waits for its
// clean-up (withdrawing from a queue, giving back what was granted to it
// meanwhile) before it returns and leaves the clean-up to run on in the
// background, and how long a call whose context ended still waits for a
// reply about to arrive: every blocking call returns within cleanupWait
// (plus scheduling) of the end of its context.
const cleanupWait = 25 * time.Millisecond

// detached returns a context for clean-up after ctx ended: it keeps ctx's
// values, not its cancellation.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// call runs do, one call to Redis, and returns what it returned; or, as
// soon as ctx ends or the Client is closed, the reason, with abandoned set.
// A failure that do returns once ctx has ended (see ended) is reported as
// ctx's error: a call that outlives its context fails with its context's
// reason, whatever Redis said meanwhile.
//
// go-redis honours a context's deadline on a read only when its client was
// built with ContextTimeoutEnabled, which most are not: a call on a
// stalled connection would hold its caller for the client's read timeout.
// So do runs in another goroutine (one of the Client's workers: see
// callGroup), with a context detached from ctx's cancellation (bounded by
// cleanupTimeout), and the caller stops waiting cleanupWait after ctx
// ends. An abandoned call goes on: when it returns, late (if not nil) gets
// its reply, to undo whatever it did. Close waits for it.
func (c *Client) call(ctx context.Context, do func(context.Context) ([]int64, error), late func([]int64, error)) (res []int64, abandoned bool, err error) {
	if err := ended(ctx); err != nil {
		return nil, false, notSent{err}
	}
	return c.callFor(ctx, do, late, true, false)
}

// callTaking is call for an attempt to take a lock or permits: once Close
// has begun it is not sent, and fails with ErrClosed, so that a call under
// way when Close came takes nothing while Close gives every hold back. (A
// clean-up or a release is still sent: see callFor.)
func (c *Client) callTaking(ctx context.Context, do func(context.Context) ([]int64, error), late func([]int64, error)) (res []int64, abandoned bool, err error) {
	if err := ended(ctx); err != nil {
		return nil, false, notSent{err}
	}
	return c.callFor(ctx, do, late, true, true)
}

// notSent is the error of a call that was not sent: ctx had ended before.
type notSent struct{ err error }

func (e notSent) Error() string { return e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// callFor is call, except that it runs do even when ctx has ended already
// (and then does not wait for it); grace says whether the caller waits a
// little longer for a reply about to arrive once ctx has ended; taking,
// whether do is an attempt to take something, which is not sent once
// Close has begun.
func (c *Client) callFor(ctx context.Context, do func(context.Context) ([]int64, error), late func([]int64, error), grace, taking bool) (res []int64, abandoned bool, err error) {
	if !c.calls.start() {
		if taking {
			return nil, false, notSent{ErrClosed}
		}
		// Closed: a clean-up or a release still runs, in the caller's
		// goroutine.
		dctx, cancel := detached(ctx)
		defer cancel()
		res, err := do(dctx)
		return res, false, err
	}
	if taking && c.ctx.Err() != nil {
		c.calls.done()
		return nil, false, notSent{ErrClosed}
	}
	type reply struct {
		res []int64
		err error
	}
	ch := make(chan reply, 1)
	var gaveUp bool // guarded by c.calls.mu
	c.calls.run(func() {
		defer c.calls.done()
		// The call is profiled under its caller's labels (pprof.Do), as
		// it was in a goroutine of its own; an idle worker has none.
		pprof.SetGoroutineLabels(ctx)
		defer pprof.SetGoroutineLabels(context.Background())
		dctx, cancel := detached(ctx)
		res, err := do(dctx)
		cancel()
		c.calls.mu.Lock()
		if !gaveUp {
			ch <- reply{res, err}
			c.calls.mu.Unlock()
			return
		}
		c.calls.mu.Unlock()
		if late != nil {
			late(res, err)
		}
	})
	var why error
	select {
	case r := <-ch:
		if r.err != nil {
			// A failure that arrives once ctx's deadline has passed
			// is the deadline's, even before ctx is told (see ended).
			return r.res, false, cmp.Or(ended(ctx), r.err)
		}
		return r.res, false, nil
	case <-ctx.Done():
		why = ctx.Err()
		if !grace {
			break
		}
		// A reply may be about to arrive: one that does within
		// cleanupWait of ctx's end saves an undo.
		t := time.NewTimer(time.Until(graceEnd(ctx)))
		select {
		case r := <-ch:
			t.Stop()
			if r.err != nil {
				return r.res, false, why
			}
			return r.res, false, nil
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
		}
	case <-c.ctx.Done():
		why = ErrClosed
	}
	c.calls.mu.Lock()
	defer c.calls.mu.Unlock()
	select {
	case r := <-ch: // it returned meanwhile
		if r.err != nil {
			return r.res, false, why
		}
		return r.res, false, nil
	default:
		gaveUp = true
		return nil, true, why
	}
}

// background runs do in one of the Client's workers, with a context that
// ends cleanupTimeout later (not at Close, which waits for it), unless the
// Client is closed already; it never waits.
func (c *Client) background(do func(ctx context.Context)) {
	if !c.calls.start() {
		return
	}
	c.calls.run(func() {
		defer c.calls.done()
		ctx, cancel := detached(c.ctx)
		defer cancel()
		do(ctx)
	})
}

// cleanup runs do, a clean-up call to Redis, detached from ctx's
// cancellation, and waits for it until graceEnd(ctx): then it goes on in
// the background (Close waits for it). do always runs, even when that
// budget is spent already: a clean-up is due whatever ctx says.
func (c *Client) cleanup(ctx context.Context, do func(context.Context) ([]int64, error)) {
	wait, cancel := context.WithDeadline(context.WithoutCancel(ctx), graceEnd(ctx))
	defer cancel()
	_, _, _ = c.callFor(wait, do, nil, false, false)
}

// ended returns ctx's error once ctx has ended or its deadline has passed.
// On a loaded machine the timer that ends a context fires late: once the
// deadline has passed, ended waits for ctx to be told (at most
// cleanupWait), so that a call that returns after its deadline returns the
// deadline's error, not one that Redis (or the network) gave in between,
// and its caller finds ctx.Err() set. A context that is still not told
// then (one of the caller's own making) gets DeadlineExceeded.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dl, ok := ctx.Deadline()
	if !ok || time.Now().Before(dl) {
		return nil
	}
	t := time.NewTimer(cleanupWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return context.DeadlineExceeded
	}
}

// graceEnd returns until when a call whose ctx has ended (or is about to)
// may still wait for Redis: cleanupWait after ctx ended (its deadline, or
// when it was seen cancelled, if it was marked), else cleanupWait from now.
// A call waits for a reply about to arrive and then for its clean-up within
// that one budget.
func graceEnd(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return dl.Add(cleanupWait)
	}
	if m, ok := ctx.Value(endKey{}).(*atomic.Int64); ok {
		if at := m.Load(); at != 0 {
			return time.Unix(0, at).Add(cleanupWait)
		}
	}
	return time.Now().Add(cleanupWait)
}

// endKey is the context key of the time a marked context ended.
type endKey struct{}

// marked returns ctx, carrying the time it ends (for graceEnd) once it
// does, and a function that stops watching it.
func marked(ctx context.Context) (context.Context, func() bool) {
	if ctx.Done() == nil {
		return ctx, func() bool { return true }
	}
	at := new(atomic.Int64)
	stop := context.AfterFunc(ctx, func() { at.CompareAndSwap(0, time.Now().UnixNano()) })
	return context.WithValue(ctx, endKey{}, at), stop
}

// releasing returns the context a release waits with: ctx, or, when ctx
// has ended already, or its deadline has passed (a deferred Unlock after a
// timeout; see ended), one of its own, bounded by cleanupTimeout: a release
// is due whatever ctx says.
func releasing(ctx context.Context) (context.Context, context.CancelFunc) {
	if ended(ctx) != nil {
		return detached(ctx)
	}
	return ctx, func() {}
}

// settle runs release, an idempotent release script call, as persist does
// (again while Redis cannot serve it for now), waiting for it with ctx; an
// abandoned one goes on, and late (if not nil) gets its outcome when it
// returns. It returns the script's reply.
func (c *Client) settle(ctx context.Context, release func(context.Context) (int64, error), late func(int64, error)) (int64, bool, error) {
	// Sent even when ctx has ended since the caller looked (releasing):
	// a release is due whatever ctx says.
	res, abandoned, err := c.callFor(ctx, func(ctx context.Context) ([]int64, error) {
		var res int64
		err := c.persist(ctx, func() (err error) {
			res, err = release(ctx)
			return err
		})
		return []int64{res}, err
	}, func(res []int64, err error) {
		if late != nil {
			if err != nil {
				late(0, redisError(err))
				return
			}
			late(res[0], nil)
		}
	}, true, false)
	if err != nil {
		return 0, abandoned, redisError(err)
	}
	return res[0], false, nil
}

// notConfirmed says that a release failed or was not confirmed in time:
// what it released is no longer renewed, and runs out within its lease.
func notConfirmed(err error) error {
	return fmt.Errorf("%w (the release is not confirmed: it is no longer renewed, and runs out in Redis within its lease)", err)
}

// workerIdle is how long a worker goroutine of a Client (see callGroup)
// waits for its next call before it exits.
const workerIdle = 5 * time.Second

// callGroup runs the calls to Redis that go on in goroutines other than
// their callers', and counts them, so that Close can wait for them; it
// counts the calls that take something too (Client.enter). Once closed, it
// starts no more.
//
// The goroutines are workers that outlive a call: one that has run a call
// waits up to idleFor for the next. A goroutine started for each call was
// created and then grew its stack, copying it, through go-redis's calls:
// 12 % of the CPU in a profile of uncontended Lock and Unlock (see
// docs/benchmarks.md, "The client's own cost"). A call goes to the worker
// that became idle last, so that after a burst the workers it left idle
// run out while a trickle of calls keeps one busy.
type callGroup struct {
	idleFor  time.Duration
	stop     chan struct{} // closed once closed and drained: workers exit
	stopOnce sync.Once
	workers  sync.WaitGroup

	mu      sync.Mutex
	n       int
	closed  bool
	drained chan struct{} // closed when closed and n is 0
	idle    []*worker     // waiting for a call, the last idle last
}

// worker is a worker goroutine's mailbox: a call taken off the idle list
// for it is put here, and it takes it however it stops waiting.
type worker struct{ calls chan func() }

func newCallGroup(idleFor time.Duration) *callGroup {
	return &callGroup{idleFor: idleFor, stop: make(chan struct{}), drained: make(chan struct{})}
}

// start counts a new call, unless the group is closed.
func (g *callGroup) start() bool {
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
func (g *callGroup) run(f func()) {
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
func (g *callGroup) work(w *worker, f func()) {
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
func (g *callGroup) retire(w *worker) bool {
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
func (g *callGroup) done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n--; g.n == 0 && g.closed {
		close(g.drained)
	}
}

// close starts no more calls, waits for those running to return, and
// then for the workers to exit.
func (g *callGroup) close() {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		if g.n == 0 {
			close(g.drained)
		}
	}
	g.mu.Unlock()
	<-g.drained
	g.stopOnce.Do(func() { close(g.stop) })
	g.workers.Wait()
}

// persist runs call, an idempotent script call (a release), again while it
// fails because Redis cannot be reached or cannot serve for now (a
// restart, a failover: see transient) or its reply was cut short, with a
// growing pause, for at most cleanupTimeout and while ctx lasts. It returns
// call's last error.
func (c *Client) persist(ctx context.Context, call func() error) error {
	deadline := time.Now().Add(cleanupTimeout)
	pause := time.Duration(0) // the first retry goes at once
	for {
		err := call()
		if err == nil || !(c.transient(err) || errors.Is(err, context.Canceled)) || time.Now().Add(pause).After(deadline) {
			return err
		}
		c.relocate()
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		pause = min(max(2*pause, 50*time.Millisecond), maxBackoff)
	}
}

// outlasts reports whether a waiting call outlasts an attempt that failed
// with err: Redis could not be reached or serve it for now (see
// transient). It then has a Redis Cluster client reload its slot map, so
// that the next attempt goes where the slot is served now.
func (c *Client) outlasts(err error) bool {
	if !c.transient(err) {
		return false
	}
	c.relocate()
	return true
}

// relocate has a Redis Cluster client reload its slot map after a call
// failed to reach its primary: after a failover, go-redis would otherwise
// keep sending the slot's commands to the primary that died.
func (c *Client) relocate() {
	if c.cluster != nil {
		c.cluster.ReloadState(c.ctx)
	}
}

// transient reports whether err says Redis could not be reached or could
// not serve the call for now (a network error, a timeout, a server loading
// its data, a cluster failing over, or moving the call's slot: a cluster
// client follows a redirection, ASK or MOVED, a few times, and returns the
// last one when the slot is still on its way), rather than a final answer.
func (c *Client) transient(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	prefixes := []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY"}
	if c.cluster != nil {
		prefixes = append(prefixes, "ASK ", "MOVED ")
	}
	for _, prefix := range prefixes {
		if strings.HasPrefix(err.Error(), prefix) {
			return true
		}
	}
	return false
}

// mayHaveRun reports whether a command that failed with err may have run
// in Redis all the same. Only one that was never sent did not: an error
// reply, or a failure to connect, may come from go-redis's retry of a
// command whose first copy ran and whose reply was lost.
func mayHaveRun(err error) bool {
	return !errors.As(err, new(notSent))
}
