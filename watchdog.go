package redisync

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

// watchdogBatch is the most entries renewed by one script call.
const watchdogBatch = 256

// watchdog is the one goroutine of a Client that keeps holds and fair
// waiters alive: it renews every watchdog-managed lease at a third of its
// length, heartbeats every queued fair waiter at a third of its heartbeat,
// and notices when a hold is lost. Entries due at about the same time are
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
	held    []func(context.Context) // the releases of the holds registered when it stopped
	next    time.Time               // when run will look next
}

// keepalive is one entry of the watchdog: a hold (of a lock, or of a
// semaphore's permits) or a queued waiter.
type keepalive struct {
	kind  string        // the entry's kind in renew.lua: "hold", "sem", "wait" or "swait"
	owner string        // owner id
	name  string        // waiter: of its lock or semaphore, for events
	keys  []string      // its keys in renew.lua, in order
	ttl   time.Duration // lease of a hold, heartbeat of a waiter
	hold  bool          // lost when its deadline passes unrenewed
	renew bool          // false for a hold with a fixed lease, or past until
	until time.Time     // hold: no renewal is sent from then on (WithMaxHold); zero: no cap

	due       time.Time             // next renewal
	deadline  time.Time             // when it runs out in Redis at the earliest; a hold is lost then unless renewed
	confirmed time.Time             // waiter: when the last call that found it queued was sent
	busy      bool                  // a renewal of it is in flight
	gone      func()                // called once, without locks, when dropped by the watchdog
	free      func()                // waiter: called, without locks, when its lock is found free
	release   func(context.Context) // hold: releases it in Redis, when the Client is closed
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
		e.due = sent.Add(ttl / 3)
	} else {
		e.due = e.deadline
	}
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

// confirmed returns when the last call that found the waiter e queued was
// sent: a hand-off to it came later.
func (w *watchdog) confirmed(e *keepalive) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return e.confirmed
}

// registered reports whether e is still an entry: neither removed nor
// dropped as gone.
func (w *watchdog) registered(e *keepalive) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.entries[e]
	return ok
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
		case e.renew && !e.busy && !now.Before(e.due.Add(-e.ttl/18)):
			// A hold's renewal is of use until its lease runs out; a
			// waiter's heartbeat for as long as Redis keeps its record
			// (a late one still refreshes it), which is at least a
			// heartbeat from now.
			e.busy = true
			limit := now.Add(e.ttl)
			if e.hold {
				limit = e.deadline
			}
			batch = append(batch, renewal{e: e, kind: e.kind, owner: e.owner, keys: e.keys, ttl: e.ttl, limit: limit})
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
		if e.renew && !e.busy && e.due.Add(-e.ttl/18).Before(next) {
			next = e.due.Add(-e.ttl / 18)
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
		case err == nil && i < len(res) && res[i] == 1:
			e.set(sent, e.ttl)
		case err == nil && i < len(res) && res[i] == 2:
			e.set(sent, e.ttl)
			gone = append(gone, e.free)
		case err == nil:
			delete(w.entries, e)
			gone = append(gone, e.gone)
		default:
			// Try again soon; run reports the hold lost if its
			// deadline passes first.
			e.due = now.Add(min(max(e.ttl/10, time.Millisecond), time.Second))
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
// to wake them (once per lock or semaphore).
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
		if i >= len(res) || res[i] != 2 || seen[r.keys[2]] {
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
// closed, keeps their releases for Close, and makes later adds fail.
func (w *watchdog) stop() {
	var gone []func()
	w.mu.Lock()
	w.stopped = true
	for e := range w.entries {
		if e.hold {
			gone = append(gone, e.gone)
			if e.release != nil {
				w.held = append(w.held, e.release)
			}
		}
	}
	clear(w.entries)
	w.mu.Unlock()
	for _, f := range gone {
		f()
	}
}

// wait waits for run to exit after the Client was closed, and returns the
// releases of the holds it dropped.
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
