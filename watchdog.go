package redisync

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
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
	cluster bool            // a Redis Cluster: one hash slot per script call
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

	waiters  map[*waitSet]struct{} // waiters: the calls kept alive, nudged when they must look again
	ran      [4]stamp              // waiters: the last heartbeats, in the order they were sent
	beat     bool                  // waiters: a heartbeat was sent, which may have written the Client's deadline
	farewell bool                  // waiters: all have left; the next call removes the Client's deadline
}

// stamp is a heartbeat of waiters: when it was sent, and the server time
// (ms) at which it ran.
type stamp struct {
	sent time.Time
	ms   int64
}

func newWatchdog(rdb redis.UniversalClient, ctx context.Context, ev *events) *watchdog {
	_, cluster := rdb.(*redis.ClusterClient)
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

// join keeps the queued call of ws alive, with the Client's other waiters
// on the same queue (kind "wait" for a fair lock's, "swait" for a
// semaphore's; owner: the Client's id; name: of what they wait for, for
// events; keys: the queue, the waiters' records, and what they wait for).
// One heartbeat serves them all: it moves the Client's deadline in the
// waiters hash (scripts/lib.lua, CLIENT_FIELD) every ttl/3, and nudges
// them all when they must look again. every is how often: at most ttl/3,
// and less when a hold handed to them has a shorter lease (see
// place.confirmed). sent is when the attempt that queued the call was sent:
// its own deadline in Redis lasts ttl from then. It returns the entry, or
// nil when the Client is closed.
func (w *watchdog) join(kind, owner, name string, keys []string, ttl, every time.Duration, sent time.Time, ws *waitSet) *keepalive {
	key := kind + " " + keys[0]
	w.mu.Lock()
	e := w.waiting[key]
	if e != nil {
		e.waiters[ws] = struct{}{}
		e.ttl, e.every = min(e.ttl, ttl), min(e.every, every)
		// The call's own deadline lasts ttl from sent; the Client's
		// must be moved before it passes.
		if due := sent.Add(every); due.Before(e.due) {
			e.due = due
			w.pokeIfBefore(e)
		}
		w.mu.Unlock()
		return e
	}
	w.mu.Unlock()
	e = &keepalive{kind: kind, owner: owner, name: name, keys: keys, ttl: ttl, every: every, renew: true,
		waiters: map[*waitSet]struct{}{ws: {}}}
	if !w.add(e, sent, ttl) {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if other := w.waiting[key]; other != nil {
		// Another call of the Client joined meanwhile: share its entry.
		delete(w.entries, e)
		other.waiters[ws] = struct{}{}
		other.ttl, other.every = min(other.ttl, ttl), min(other.every, every)
		if due := sent.Add(every); due.Before(other.due) {
			other.due = due
			w.pokeIfBefore(other)
		}
		return other
	}
	w.waiting[key] = e
	return e
}

// leave stops keeping ws's call alive on e. The entry goes with its last
// call; if a heartbeat wrote the Client's deadline, it is removed from
// Redis by one more call in the next batch (a farewell), so that a lock
// in constant use does not gather the deadlines of Clients that waited on
// it once. (A release that drops a dead Client's waiter removes that
// Client's deadline; one that dies between its last waiter leaving and the
// farewell, or whose live-looking waiter is handed the lock, leaves it
// until the lock is idle for two heartbeats: see docs/design.md.)
func (w *watchdog) leave(e *keepalive, ws *waitSet) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(e.waiters, ws)
	key := e.kind + " " + e.keys[0]
	if len(e.waiters) > 0 || w.waiting[key] != e {
		return
	}
	delete(w.waiting, key)
	if !e.beat {
		delete(w.entries, e)
		return
	}
	e.farewell, e.due = true, time.Now()
	w.pokeIfBefore(e)
}

// ranBefore returns the send time of the last heartbeat of e that Redis
// ran before the server time ms, or the zero time if none is known. A
// hand-off (or grant) at ms came later than that heartbeat was sent: the
// lease it gave lasts at least that long from then. (Redis expires keys by
// the same clock, so if the clock stepped back and a heartbeat that ran
// after the hand-off seems earlier, the lease ends later by as much.)
func (w *watchdog) ranBefore(e *keepalive, ms int64) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var t time.Time
	for _, s := range e.ran {
		if !s.sent.IsZero() && s.ms < ms && s.sent.After(t) {
			t = s.sent
		}
	}
	return t
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

// renewal is one entry of a batch, with what the call needs of it, read
// under w.mu when the batch was collected.
type renewal struct {
	e     *keepalive
	kind  string
	owner string
	keys  []string
	ttl   time.Duration
	limit time.Time // when a reply is of no more use
}

// split cuts a batch into script calls of at most watchdogBatch entries.
// On a Redis Cluster each call holds entries of one hash slot only, as a
// script may only touch keys of one slot.
func (w *watchdog) split(batch []renewal) [][]renewal {
	if len(batch) == 0 {
		return nil
	}
	groups := [][]renewal{batch}
	if w.cluster {
		bySlot := make(map[uint16][]renewal)
		for _, r := range batch {
			slot := schema.Slot(r.keys[0])
			bySlot[slot] = append(bySlot[slot], r)
		}
		groups = groups[:0]
		for _, g := range bySlot {
			groups = append(groups, g)
		}
	}
	var parts [][]renewal
	for _, g := range groups {
		for len(g) > 0 {
			n := min(len(g), watchdogBatch)
			parts = append(parts, g[:n])
			g = g[n:]
		}
	}
	return parts
}

// send renews a batch in one script call, from a goroutine of its own, and
// applies the result.
func (w *watchdog) send(batch []renewal) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.renew(batch)
	}()
}

// renew renews a batch in one script call and applies the result.
func (w *watchdog) renew(batch []renewal) {
	var keys []string
	args := make([]any, 0, 3*len(batch))
	sent := time.Now()
	limit := sent.Add(time.Hour)
	for _, r := range batch {
		keys = append(keys, r.keys...)
		limit = minTime(limit, r.limit)
		args = append(args, r.kind, r.owner, r.ttl.Milliseconds())
	}
	res, err := w.call(limit, keys, args)
	if err != nil && w.cluster {
		// The slot's primary may have failed over: have go-redis look
		// for the new one before the retry.
		w.rdb.(*redis.ClusterClient).ReloadState(w.ctx)
	}

	now := time.Now()
	if err == nil && len(res) != len(batch)+1 {
		err = fmt.Errorf("redisync: %d replies from the renew script for %d entries", len(res), len(batch))
	}
	w.told(batch, res, err, now.Sub(sent))
	var gone []func()
	w.mu.Lock()
	for i, r := range batch {
		e := r.e
		e.busy = false
		if _, ok := w.entries[e]; !ok {
			continue // released or lost meanwhile
		}
		switch {
		case e.farewell && r.ttl == 0:
			delete(w.entries, e) // sent once, whatever came of it
		case e.farewell:
			// A heartbeat sent before the last waiter left: the farewell
			// goes next.
		case err == nil && e.waiters != nil:
			e.set(sent, e.ttl)
			copy(e.ran[:], e.ran[1:])
			e.ran[len(e.ran)-1] = stamp{sent: sent, ms: res[len(batch)]}
			if res[i] != 1 {
				for ws := range e.waiters {
					gone = append(gone, ws.nudge)
				}
			}
		case err == nil && res[i] == 1:
			e.set(sent, e.ttl)
		case err == nil:
			delete(w.entries, e)
			gone = append(gone, e.gone)
		default:
			// Try again soon; run reports the hold lost if its
			// deadline passes first. A heartbeat of waiters may have run
			// without its reply arriving: they look again, in case it
			// found their Client's deadline passed.
			e.due = now.Add(min(max(e.ttl/10, time.Millisecond), time.Second))
			for ws := range e.waiters {
				gone = append(gone, ws.nudge)
			}
		}
		w.pokeIfBefore(e)
	}
	w.mu.Unlock()
	for _, f := range gone {
		f()
	}
}

// told tells the events queue about a renewal call of batch that took
// latency: its success or failure, and the waiters it found with nobody
// to wake them (once per lock or semaphore: reply 2).
func (w *watchdog) told(batch []renewal, res []int64, err error, latency time.Duration) {
	if w.ev == nil {
		return
	}
	if err != nil {
		if w.ctx.Err() == nil { // not the Client's Close
			w.ev.emit(Event{Kind: KindRenewalFailed, Count: len(batch), Latency: latency, Err: err})
		}
		return
	}
	w.ev.emit(Event{Kind: KindRenewal, Count: len(batch), Latency: latency})
	var seen map[string]bool
	for i, r := range batch {
		if res[i] != 2 || seen[r.keys[2]] {
			continue
		}
		if seen == nil {
			seen = make(map[string]bool)
		}
		seen[r.keys[2]] = true
		prim := PrimitiveMutex
		if r.kind == "swait" {
			prim = PrimitiveSemaphore
		}
		w.ev.emit(Event{Kind: KindDeadWaiter, Primitive: prim, Name: r.e.name})
	}
}

// call runs the renew script, giving up at limit: a renewal that has not
// answered by the first deadline of its batch is of no use. go-redis
// bounds a call by its context only when the go-redis client was built
// with ContextTimeoutEnabled, so the call runs in a goroutine of its own
// and the watchdog stops waiting for it at limit; go-redis's own timeouts
// end it later (Close waits for it). A renewal that reaches Redis after
// limit only delays other owners.
func (w *watchdog) call(limit time.Time, keys []string, args []any) ([]int64, error) {
	ctx, cancel := context.WithDeadline(w.ctx, limit)
	type reply struct {
		res []int64
		err error
	}
	done := make(chan reply, 1)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer cancel()
		res, err := renewScript.Run(ctx, w.rdb, keys, args...).Int64Slice()
		done <- reply{res, err}
	}()
	select {
	case r := <-done:
		return r.res, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
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
				_ = renewScript.Run(ctx, w.rdb, e.keys, e.kind, e.owner, 0).Err()
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
