package redisync

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// watchdogBatch is the most entries renewed by one script call.
const watchdogBatch = 256

// watchdog is the one goroutine of a Client that keeps holds and fair
// waiters alive: it renews every watchdog-managed lease at a third of its
// length, heartbeats the Client's fair waiters at a third of their
// heartbeat (one entry per lock or semaphore on which it has waiters, not
// one per waiter: see join), and notices when a hold is lost. Entries due at about the same time are
// renewed together in one script call (one per hash slot on a cluster).
// A hold with a fixed lease is never renewed; the watchdog only reports it
// lost when its lease has run out.
//
// Renewals are sent from goroutines of their own, at most one call in
// flight per entry, so that no slow call (a stalled primary, a blackholed
// connection) delays another slot's renewals or a loss notification: the
// watchdog goes on checking deadlines while calls are out.
//
// A hold's deadline is when its lease runs out by the local clock: the
// send time of the call that last set the lease, plus the lease, less a
// margin for clock drift. At the deadline the hold is reported lost unless
// a renewal has moved it, so the holder hears of the loss before Redis
// lets anyone else in.
type watchdog struct {
	rdb     redis.UniversalClient
	cluster clusterClient   // rdb, on a Redis Cluster: one hash slot per script call; nil otherwise
	ctx     context.Context // ends when the Client is closed
	ev      *events         // renewals and dead waiters are told here; may be nil
	poke    chan struct{}   // wakes run early; never blocks
	wg      sync.WaitGroup

	mu      sync.Mutex
	started bool
	stopped bool
	entries map[*keepalive]struct{}
	waiting map[string]*keepalive   // the waiters' entries, by kind and queue key
	held    []func(context.Context) // the releases of the holds registered when it stopped
	next    time.Time               // when run will look next
}

// keepalive is one entry of the watchdog: a hold (of a lock, or of a
// semaphore's permits), or the Client's queued waiters on one lock or
// semaphore.
type keepalive struct {
	kind  string        // the entry's kind in renew.lua: "hold", "sem", "wait" or "swait"
	owner string        // owner id; the Client's id for waiters
	name  string        // waiters: of their lock or semaphore, for events
	keys  []string      // its keys in renew.lua, in order
	ttl   time.Duration // lease of a hold, heartbeat of a waiter
	every time.Duration // waiters: how often they are heartbeated; for a hold, ttl/3
	hold  bool          // lost when its deadline passes unrenewed
	renew bool          // false for a hold with a fixed lease, or past until
	until time.Time     // hold: no renewal is sent from then on (WithMaxHold); zero: no cap

	due       time.Time             // next renewal
	deadline  time.Time             // when it runs out in Redis at the earliest; a hold is lost then unless renewed
	confirmed time.Time             // when the last call that set its lease (or heartbeat) was sent
	busy      bool                  // a renewal of it is in flight
	gone      func()                // hold: called once, without locks, when lost
	release   func(context.Context) // hold: releases it in Redis, when the Client is closed

	waiters  map[*waitSet]time.Time // waiters: the calls kept alive, nudged when they must look again, each with until when its own deadline in Redis surely lasts (see safeUntil)
	ran      [4]stamp               // waiters: the last heartbeats, in the order they were sent
	beat     bool                   // waiters: a heartbeat was sent, which may have written the Client's deadline
	farewell bool                   // waiters: all have left; the next call removes the Client's deadline
}

func newWatchdog(rdb redis.UniversalClient, cluster clusterClient, ctx context.Context, ev *events) *watchdog {
	return &watchdog{
		rdb:     rdb,
		cluster: cluster,
		ctx:     ctx,
		ev:      ev,
		poke:    make(chan struct{}, 1),
		entries: make(map[*keepalive]struct{}),
		waiting: make(map[string]*keepalive),
	}
}

// drift is the margin taken off a lease for clock drift between this
// process and Redis (as in Redlock: 1% plus 2 ms).
func drift(lease time.Duration) time.Duration {
	return lease/100 + 2*time.Millisecond
}

// set schedules e after a call sent at sent set its lease (or heartbeat)
// to ttl. w.mu must be held, or e not registered yet.
//
// The deadline never moves earlier: no script shortens a hold's lease (a
// renewal after Mutex.Extend leaves the longer lease be), so every call
// that set it gives a lower bound of when Redis lets it run out, whatever
// order such calls ran in.
func (e *keepalive) set(sent time.Time, ttl time.Duration) {
	e.deadline = maxTime(e.deadline, sent.Add(ttl-drift(ttl)))
	e.confirmed = sent
	if e.renew {
		e.due = sent.Add(e.interval(ttl))
	} else {
		e.due = e.deadline
	}
}

// interval returns how long after a call that set e's lease (or
// heartbeat) to ttl the next is due.
func (e *keepalive) interval(ttl time.Duration) time.Duration {
	if e.every > 0 {
		return e.every
	}
	return ttl / 3
}

// add registers e, scheduled after a call sent at sent set its lease (or
// heartbeat) to ttl. It reports false, and registers nothing, when the
// Client is closed.
func (w *watchdog) add(e *keepalive, sent time.Time, ttl time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.ctx.Err() != nil {
		return false
	}
	e.set(sent, ttl)
	w.entries[e] = struct{}{}
	if !w.started {
		w.started = true
		w.wg.Add(1)
		go w.run()
	}
	w.pokeIfBefore(e)
	return true
}

// rearm moves e's schedule after a call sent at sent set its lease again.
func (w *watchdog) rearm(e *keepalive, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.entries[e]; ok && sent.After(e.confirmed) {
		e.set(sent, e.ttl)
		w.pokeIfBefore(e)
	}
}

// extend moves e's deadline after a call sent at sent made its lease last
// at least lease (the deadline never moves earlier). It reports false, and
// changes nothing, when e is no longer registered: removed, or dropped as
// lost.
func (w *watchdog) extend(e *keepalive, sent time.Time, lease time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.entries[e]; !ok {
		return false
	}
	e.deadline = maxTime(e.deadline, sent.Add(lease-drift(lease)))
	if !e.renew {
		e.due = e.deadline
	}
	w.pokeIfBefore(e)
	return true
}

// pokeIfBefore wakes run when e is due before run would look. w.mu must be
// held.
func (w *watchdog) pokeIfBefore(e *keepalive) {
	if e.due.Before(w.next) || e.deadline.Before(w.next) {
		select {
		case w.poke <- struct{}{}:
		default: // run is already poked
		}
	}
}

// remove unregisters e; its gone function will not be called.
func (w *watchdog) remove(e *keepalive) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.entries, e)
}

// run sends the renewals that are due, and reports lost what is past its
// deadline, until the Client is closed. Then every hold still registered
// is reported lost.
func (w *watchdog) run() {
	defer w.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		for _, part := range w.split(w.collect(time.Now())) {
			w.send(part)
		}
		t.Reset(w.sleep(time.Now()))
		select {
		case <-w.ctx.Done():
			w.stop()
			return
		case <-w.poke:
		case <-t.C:
		}
	}
}

// collect drops the holds past their deadline (in flight or not) and
// returns the entries due for renewal (or about to be: within a sixth of
// their interval) that have no renewal in flight, marked busy.
func (w *watchdog) collect(now time.Time) []renewal {
	var batch []renewal
	var gone []func()
	w.mu.Lock()
	for e := range w.entries {
		switch {
		case e.hold && !now.Before(e.deadline):
			delete(w.entries, e)
			gone = append(gone, e.gone)
		case e.renew && !e.until.IsZero() && !now.Before(e.until):
			// Renewed for as long as it may be: from now on it is
			// a hold with a fixed lease, lost at its deadline.
			e.renew, e.due = false, e.deadline
		case e.renew && !e.busy && !now.Before(e.due.Add(-e.interval(e.ttl)/6)):
			// A hold's renewal is of use until its lease runs out; a
			// waiter's heartbeat for as long as Redis keeps its record
			// (a late one still refreshes it), which is at least a
			// heartbeat from now.
			e.busy = true
			limit := now.Add(e.ttl)
			if e.hold {
				limit = e.deadline
			}
			ttl := e.ttl
			if e.farewell {
				ttl = 0 // see renew.lua
			}
			e.beat = e.beat || e.waiters != nil
			batch = append(batch, renewal{e: e, kind: e.kind, owner: e.owner, keys: e.keys, ttl: ttl, limit: limit})
		}
	}
	w.mu.Unlock()
	for _, f := range gone {
		f()
	}
	return batch
}

// sleep returns how long run may sleep: until the next renewal is due or
// the next deadline passes.
func (w *watchdog) sleep(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	next := now.Add(time.Hour)
	for e := range w.entries {
		if e.renew && !e.busy && e.due.Add(-e.interval(e.ttl)/6).Before(next) {
			next = e.due.Add(-e.interval(e.ttl) / 6)
		}
		if e.hold && e.deadline.Before(next) {
			next = e.deadline
		}
	}
	w.next = next
	return max(next.Sub(now), 0)
}

// stop reports every hold still registered as lost, after the Client was
// closed, keeps their releases for Close (and the farewells of the
// waiters' entries whose deadline a heartbeat wrote: see leave), and makes
// later adds fail.
func (w *watchdog) stop() {
	var gone []func()
	w.mu.Lock()
	w.stopped = true
	for e := range w.entries {
		switch {
		case e.hold:
			gone = append(gone, e.gone)
			if e.release != nil {
				w.held = append(w.held, e.release)
			}
		case e.waiters != nil && e.beat: // left or not
			w.held = append(w.held, func(ctx context.Context) {
				farewell := []renewal{{kind: e.kind, owner: e.owner, keys: e.keys}} // ttl 0: a farewell
				_ = renewCall(farewell).run(ctx, w.rdb).Err()
			})
		}
	}
	clear(w.entries)
	clear(w.waiting)
	w.mu.Unlock()
	for _, f := range gone {
		f()
	}
}

// wait waits for run to exit after the Client was closed, and returns the
// releases of the holds it dropped (and the waiters' farewells).
func (w *watchdog) wait() []func(context.Context) {
	// From now on no add starts run: an Add racing Wait on a WaitGroup
	// whose count is zero is a race.
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.wg.Wait()
	// run never started, or exited before the last add: drop what is left.
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	held := w.held
	w.held = nil
	return held
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
