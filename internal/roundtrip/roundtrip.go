// Package roundtrip runs a Client's round trips to Redis (one command or
// script sent, its reply read) so that a caller never waits past its
// context: the caller returns within CleanupWait of its context's end,
// and what a round trip it gave up on did is undone, or, for a release,
// done again until it is known. Close waits for every round trip.
//
// go-redis honours a context's deadline on a read only when its client was
// built with ContextTimeoutEnabled, which most are not: a round trip on a
// stalled connection would hold its caller for the client's read timeout.
// So a Client of one server runs its round trips on lanes (see Lanes),
// connections of its own that the caller's context cuts short, in the
// caller's goroutine. A Client of a Redis Cluster, whose connections
// go-redis picks per slot, runs each in a worker goroutine on the user's
// client, from which the caller stops waiting when its context ends; the
// reply of a round trip it gave up on goes to the undo the caller left
// for it.
package roundtrip

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// CleanupTimeout bounds the clean-up a call does after its context ended,
// and a release sent after the caller's context ended.
const CleanupTimeout = 5 * time.Second

// CleanupWait is how long a call that ends without success waits for its
// clean-up (withdrawing from a queue, giving back what was granted to it
// meanwhile) before it returns and leaves the clean-up to run on in the
// background, and how long a call whose context ended still waits for a
// reply about to arrive: every blocking call returns within CleanupWait
// (plus scheduling) of the end of its context.
const CleanupWait = 25 * time.Millisecond

// MaxPause caps the pause between two tries of a round trip that Redis
// cannot serve for now.
const MaxPause = time.Second

// Do is one round trip, with the context it may use and the client to
// send it on.
type Do func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error)

// Late gets the reply of a round trip its caller gave up on, to undo what
// it did.
type Late func(res []int64, err error)

// Runner runs the round trips of one Client.
type Runner struct {
	closing  context.Context       // ends when the Client's Close begins
	closed   error                 // what an attempt fails with once Close has begun
	relocate func()                // has a cluster client reload its slot map; nil elsewhere
	rdb      redis.UniversalClient // the user's client
	lanes    *Lanes                // the Client's own connections; nil: round trips go through workers on rdb
	calls    *group
}

// New returns the Runner of a Client: closing ends when its Close begins,
// after which attempts fail with closed; relocate, set
// only for a Redis Cluster client, has it reload its slot map. Round trips
// run on lanes, in their callers' goroutines, or when lanes is nil on rdb,
// in workers.
func New(closing context.Context, closed error, relocate func(), rdb redis.UniversalClient, lanes *Lanes) *Runner {
	return &Runner{closing: closing, closed: closed, relocate: relocate, rdb: rdb, lanes: lanes, calls: newGroup(workerIdle)}
}

// Run runs do and returns what it returned; or, as soon as ctx ends or
// the Client is closed, the reason, with abandoned set. A failure that do
// returns once ctx has ended (see Ended) is reported as ctx's error: a
// round trip that outlives its context fails with its context's reason,
// whatever Redis said meanwhile.
//
// On lanes, do runs in the caller's goroutine and is cut short
// CleanupWait after ctx ends: late (if not nil) then runs in a worker, the
// outcome unknown, to undo whatever do may have done. On workers, do runs
// in a worker with a context detached from ctx's cancellation (bounded by
// CleanupTimeout), and the caller stops waiting CleanupWait after ctx
// ends; an abandoned round trip goes on: when it returns, late (if not
// nil) gets its reply, to undo whatever it did. Close waits for late.
func (r *Runner) Run(ctx context.Context, do Do, late Late) (res []int64, abandoned bool, err error) {
	if err := Ended(ctx); err != nil {
		return nil, false, notSent{err}
	}
	if r.lanes != nil {
		return r.direct(ctx, do, late, true, false, false)
	}
	return r.callFor(ctx, do, late, true, false)
}

// Attempt is Run for an attempt to take a lock or permits: once Close has
// begun it is not sent, and fails with the Runner's closed error, so that
// a call under way when Close came takes nothing while Close gives every
// hold back. (A clean-up or a release is still sent: see callFor.)
func (r *Runner) Attempt(ctx context.Context, do Do, late Late) (res []int64, abandoned bool, err error) {
	if err := Ended(ctx); err != nil {
		return nil, false, notSent{err}
	}
	if r.lanes != nil {
		return r.direct(ctx, do, late, true, true, false)
	}
	return r.callFor(ctx, do, late, true, true)
}

// MayCopy reports whether a round trip that returned may still have a copy
// on its way: true when round trips go through the user's client, whose
// retries resend a command without telling its caller; false on lanes,
// which resend only over a connection the first copy cannot arrive by.
func (r *Runner) MayCopy() bool { return r.lanes == nil }

// notSent is the error of a round trip that was not sent.
type notSent struct{ err error }

func (e notSent) Error() string { return e.err.Error() }
func (e notSent) Unwrap() error { return e.err }

// MayHaveRun reports whether a command that failed with err may have run
// in Redis all the same. Only one that was never sent did not: an error
// reply, or a failure to connect, may come from go-redis's retry of a
// command whose first copy ran and whose reply was lost.
func MayHaveRun(err error) bool {
	return !errors.As(err, new(notSent))
}

// callFor is Run, except that it runs do even when ctx has ended already
// (and then does not wait for it); grace says whether the caller waits a
// little longer for a reply about to arrive once ctx has ended; taking,
// whether do is an attempt to take something, which is not sent once
// Close has begun.
func (r *Runner) callFor(ctx context.Context, do Do, late Late, grace, taking bool) (res []int64, abandoned bool, err error) {
	if ok, res, err := r.admit(ctx, do, taking); !ok {
		return res, false, err
	}
	g := r.calls
	type reply struct {
		res []int64
		err error
	}
	ch := make(chan reply, 1)
	var gaveUp bool // guarded by g.mu
	g.run(func() {
		defer g.done()
		// The round trip is profiled under its caller's labels (pprof.Do), as
		// it was in a goroutine of its own; an idle worker has none.
		pprof.SetGoroutineLabels(ctx)
		defer pprof.SetGoroutineLabels(context.Background())
		dctx, cancel := Detached(ctx)
		res, err := do(dctx, r.rdb)
		cancel()
		g.mu.Lock()
		if !gaveUp {
			ch <- reply{res, err}
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		if late != nil {
			late(res, err)
		}
	})
	var why error
	select {
	case rep := <-ch:
		if rep.err != nil {
			// A failure that arrives once ctx's deadline has passed
			// is the deadline's, even before ctx is told (see Ended).
			return rep.res, false, cmp.Or(Ended(ctx), rep.err)
		}
		return rep.res, false, nil
	case <-ctx.Done():
		why = ctx.Err()
		if !grace {
			break
		}
		// A reply may be about to arrive: one that does within
		// CleanupWait of ctx's end saves an undo.
		t := time.NewTimer(time.Until(GraceEnd(ctx)))
		select {
		case rep := <-ch:
			t.Stop()
			if rep.err != nil {
				return rep.res, false, why
			}
			return rep.res, false, nil
		case <-t.C:
		case <-r.closing.Done():
			t.Stop()
		}
	case <-r.closing.Done():
		why = r.closed
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case rep := <-ch: // it returned meanwhile
		if rep.err != nil {
			return rep.res, false, why
		}
		return rep.res, false, nil
	default:
		gaveUp = true
		return nil, true, why
	}
}

// admit counts in a round trip (see group), unless Close has begun: then
// an attempt to take something is not sent, and a clean-up or a release,
// still due, runs at once in the caller's goroutine on the user's client;
// ok is false, with what it returned.
func (r *Runner) admit(ctx context.Context, do Do, taking bool) (ok bool, res []int64, err error) {
	g := r.calls
	if !g.start() {
		if taking {
			return false, nil, notSent{r.closed}
		}
		dctx, cancel := Detached(ctx)
		defer cancel()
		res, err := do(dctx, r.rdb)
		return false, res, err
	}
	if taking && r.closing.Err() != nil {
		g.done()
		return false, nil, notSent{r.closed}
	}
	return true, nil, nil
}

// direct runs do on a lane, in the caller's goroutine, cut short when the
// caller stops waiting (at GraceEnd(ctx) with grace; at once when Close
// begins, for an attempt to take something, which is not sent once it
// has). A round trip cut short has an outcome nobody knows. With redo (an
// idempotent release, due whatever ctx says), it is sent again from a
// worker, on the user's client, and late (if not nil) gets what that
// returns; otherwise late (if not nil) runs in a worker, to undo whatever
// the round trip may have done. Close waits for them. Once Close has
// begun, a round trip that is still due (a release) goes on the user's
// client.
func (r *Runner) direct(ctx context.Context, do Do, late Late, grace, taking, redo bool) (res []int64, abandoned bool, err error) {
	if ok, res, err := r.admit(ctx, do, taking); !ok {
		return res, false, err
	}
	g := r.calls
	var stop context.Context
	if taking {
		stop = r.closing
	}
	res, cut, err := r.lanes.Do(ctx, grace, stop, do)
	if !cut {
		g.done()
		if err != nil {
			return res, false, cmp.Or(Ended(ctx), err)
		}
		return res, false, nil
	}
	why := ctx.Err()
	if why == nil {
		why = r.closed
	}
	if late == nil && !redo {
		g.done()
		return nil, true, why
	}
	g.run(func() { // counted by g since the start
		defer g.done()
		if !redo {
			late(nil, why)
			return
		}
		dctx, cancel := Detached(ctx)
		defer cancel()
		res, err := do(dctx, r.rdb)
		if late != nil {
			late(res, err)
		}
	})
	return nil, true, why
}

// Send runs do for a sender that stops waiting for it by itself (the
// watchdog, in a goroutine of its own): on a lane, never cut short, so
// that the connection outlives a reply that comes late and stays warm, as
// in a pool (go-redis's timeouts end a round trip that never answers); or,
// without lanes, on the user's client. Renewals and heartbeats so go on
// the connections that the Client's calls keep warm.
func (r *Runner) Send(ctx context.Context, do Do) ([]int64, error) {
	if r.lanes == nil {
		return do(ctx, r.rdb)
	}
	res, _, err := r.lanes.Do(context.WithoutCancel(ctx), false, nil, do)
	return res, err
}

// Background runs do in one of the workers, with a context that ends
// CleanupTimeout later (not at Close, which waits for it), unless the
// Client is closed already; it never waits.
func (r *Runner) Background(do func(ctx context.Context)) {
	if !r.calls.start() {
		return
	}
	r.calls.run(func() {
		defer r.calls.done()
		ctx, cancel := Detached(r.closing)
		defer cancel()
		do(ctx)
	})
}

// Cleanup runs do, a clean-up, in a worker on the user's client (never on
// a lane, which it might wait for, and which would cut it short), detached
// from ctx's cancellation, and waits for it until GraceEnd(ctx): then it
// goes on in the background (Close waits for it). do always runs, even
// when that budget is spent already: a clean-up is due whatever ctx says.
func (r *Runner) Cleanup(ctx context.Context, do Do) {
	wait, cancel := context.WithDeadline(context.WithoutCancel(ctx), GraceEnd(ctx))
	defer cancel()
	_, _, _ = r.callFor(wait, do, nil, false, false)
}

// Settle runs release, an idempotent release, as Persist does, waiting for
// it with ctx, and sends it even when ctx has ended already: a release is
// due whatever ctx says. An abandoned one goes on (on lanes, it is sent
// again from a worker), and late (if not nil) gets its outcome when it
// returns.
func (r *Runner) Settle(ctx context.Context, release Do, late Late) (res []int64, abandoned bool, err error) {
	persisted := func(ctx context.Context, rdb redis.UniversalClient) (res []int64, err error) {
		err = r.Persist(ctx, func() error {
			res, err = release(ctx, rdb)
			return err
		})
		return res, err
	}
	if r.lanes != nil {
		return r.direct(ctx, persisted, late, true, false, true)
	}
	return r.callFor(ctx, persisted, late, true, false)
}

// Persist runs call, an idempotent round trip (a release), again while it
// fails because Redis cannot be reached or cannot serve for now (a
// restart, a failover: see Transient) or its reply was cut short, with a
// growing pause, for at most CleanupTimeout and while ctx lasts. It returns
// call's last error.
func (r *Runner) Persist(ctx context.Context, call func() error) error {
	deadline := time.Now().Add(CleanupTimeout)
	pause := time.Duration(0) // the first retry goes at once
	for {
		err := call()
		if err == nil || !(r.Transient(err) || errors.Is(err, context.Canceled)) || time.Now().Add(pause).After(deadline) {
			return err
		}
		r.reload()
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		pause = min(max(2*pause, 50*time.Millisecond), MaxPause)
	}
}

// Outlasts reports whether a waiting call outlasts an attempt that failed
// with err: Redis could not be reached or serve it for now (see
// Transient). It then has a Redis Cluster client reload its slot map, so
// that the next attempt goes where the slot is served now.
func (r *Runner) Outlasts(err error) bool {
	if !r.Transient(err) {
		return false
	}
	r.reload()
	return true
}

// reload has a Redis Cluster client reload its slot map after a round
// trip failed to reach its primary: after a failover, go-redis would otherwise
// keep sending the slot's commands to the primary that died.
func (r *Runner) reload() {
	if r.relocate != nil {
		r.relocate()
	}
}

// Transient reports whether err says Redis could not be reached or could
// not serve the round trip for now (a network error, a timeout, a server loading
// its data, a cluster failing over, or moving the round trip's slot: a cluster
// client follows a redirection, ASK or MOVED, a few times, and returns the
// last one when the slot is still on its way), rather than a final answer.
func (r *Runner) Transient(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	prefixes := []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY"}
	if r.relocate != nil {
		prefixes = append(prefixes, "ASK ", "MOVED ")
	}
	for _, prefix := range prefixes {
		if strings.HasPrefix(err.Error(), prefix) {
			return true
		}
	}
	return false
}

// Enter counts in a call that takes something (a Lock, an Acquire),
// unless Close has begun; Leave counts it out. Close returns only once
// every call counted in has ended, its clean-up done.
func (r *Runner) Enter() bool { return r.calls.start() }

// Leave counts out a call that Enter counted in.
func (r *Runner) Leave() { r.calls.done() }

// Close starts no more round trips, waits for those running and the calls
// counted in by Enter to end, and then for the workers to exit; it closes
// the lanes. When ctx ends first, it returns ctx's error at once: what
// still runs ends by itself (each clean-up is bounded), and the last call
// to end stops the workers and closes the lanes.
func (r *Runner) Close(ctx context.Context) error {
	return r.calls.close(ctx, func() {
		if r.lanes != nil {
			r.lanes.Close()
		}
	})
}

// InFlight returns how many round trips run and calls counted in by Enter
// are under way.
func (r *Runner) InFlight() int {
	r.calls.mu.Lock()
	defer r.calls.mu.Unlock()
	return r.calls.n
}
