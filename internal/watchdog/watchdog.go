// Package watchdog keeps what a Client holds alive: it renews every hold's
// lease before it runs out, heartbeats the Client's queued waiters (one
// entry per lock or semaphore, however many of its waiters queue there),
// and reports a hold lost by its local deadline, before Redis can let
// anyone else in. Entries due at about the same time are renewed together
// in one call of the renew script (one per hash slot on a Redis Cluster),
// which the Client runs for it (Config.Renew).
package watchdog

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
)

// Batch is the most entries renewed by one script call.
const Batch = 256

// Watchdog is the one goroutine of a Client that keeps holds and fair
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
type Watchdog struct {
	cfg  Config
	ctx  context.Context // ends when the Client is closed
	poke chan struct{}   // wakes run early; never blocks
	wg   sync.WaitGroup

	mu      sync.Mutex
	started bool
	stopped bool
	entries map[*Entry]struct{}
	waiting map[string]*Entry             // the waiters' entries, by kind and queue key
	held    []func(context.Context) error // the releases of the holds registered when it stopped
	next    time.Time                     // when run will look next
}

// Config is what a Watchdog needs of its Client.
type Config struct {
	// Renew runs the renew script on batch, one entry of it per Renewal
	// in that order, and returns its reply: one integer per entry, then
	// the server time in ms.
	Renew func(ctx context.Context, batch []Renewal) ([]int64, error)
	// Sharded says that a call may touch one hash slot only (Redis
	// Cluster): a batch is split by slot.
	Sharded bool
	// Reload, if not nil, is called after a renewal call failed, so that
	// the next goes where its slot is served now.
	Reload func()
	// Events, if not nil, is told what the renewals do.
	Events Events
}

// Events is told what a Watchdog's renewals do. Its methods must not
// block.
type Events interface {
	// Renewed tells that a call renewed n entries, taking latency.
	Renewed(n int, latency time.Duration)
	// RenewFailed tells that a call of n entries failed with err.
	RenewFailed(n int, latency time.Duration, err error)
	// DeadWaiter tells that the waiters of an entry (of kind "wait" or
	// "swait") on the lock or semaphore called name found it held by
	// nobody to wake them: a hand-off to a waiter that died.
	DeadWaiter(kind, name string)
}

// Entry is one entry of the watchdog: a hold (of a lock, or of a
// semaphore's permits), or the Client's queued waiters on one lock or
// semaphore (see Join). The caller sets the exported fields before Add.
type Entry struct {
	Kind  string        // the entry's kind in renew.lua: "hold", "sem", "wait" or "swait"
	Owner string        // owner id; the Client's id for waiters
	Name  string        // waiters: of their lock or semaphore, for events
	Keys  []string      // its keys in renew.lua, in order
	TTL   time.Duration // lease of a hold, heartbeat of a waiter
	every time.Duration // waiters: how often they are heartbeated; for a hold, ttl/3
	Hold  bool          // lost when its deadline passes unrenewed
	Renew bool          // false for a hold with a fixed lease, or past Until
	Until time.Time     // hold: no renewal is sent from then on (WithMaxHold); zero: no cap
	// Gone, for a hold, is called once, without locks, when it is lost.
	Gone func()
	// Release, for a hold, releases it in Redis when the Client is
	// closed (see Wait), and returns why it could not.
	Release func(context.Context) error

	due       time.Time // next renewal
	deadline  time.Time // when it runs out in Redis at the earliest; a hold is lost then unless renewed
	confirmed time.Time // when the last call that set its lease (or heartbeat) was sent
	busy      bool      // a renewal of it is in flight
	recheck   bool      // hold: renew again as soon as the renewal in flight answers (see RenewNow)

	waiters  map[*waiters.Set]time.Time // waiters: the calls kept alive, nudged when they must look again, each with until when its own deadline in Redis surely lasts (see safeUntil)
	ran      [4]stamp                   // waiters: the last heartbeats, in the order they were sent
	beat     bool                       // waiters: a heartbeat was sent, which may have written the Client's deadline
	farewell bool                       // waiters: all have left; the next call removes the Client's deadline
}

// New returns the watchdog of a Client, which stops once ctx ends (Wait
// waits for it then). It starts its goroutine at its first Add.
func New(ctx context.Context, cfg Config) *Watchdog {
	return &Watchdog{
		cfg:     cfg,
		ctx:     ctx,
		poke:    make(chan struct{}, 1),
		entries: make(map[*Entry]struct{}),
		waiting: make(map[string]*Entry),
	}
}

// Drift is the margin taken off a lease for clock drift between this
// process and Redis (as in Redlock: 1% plus 2 ms).
func Drift(lease time.Duration) time.Duration {
	return lease/100 + 2*time.Millisecond
}

// set schedules e after a call sent at sent set its lease (or heartbeat)
// to ttl. w.mu must be held, or e not registered yet.
//
// The deadline never moves earlier: no script shortens a hold's lease (a
// renewal after Mutex.Extend leaves the longer lease be), so every call
// that set it gives a lower bound of when Redis lets it run out, whatever
// order such calls ran in.
func (e *Entry) set(sent time.Time, ttl time.Duration) {
	e.deadline = maxTime(e.deadline, sent.Add(ttl-Drift(ttl)))
	e.confirmed = sent
	if e.Renew {
		e.due = sent.Add(e.interval(ttl))
	} else {
		e.due = e.deadline
	}
}

// interval returns how long after a call that set e's lease (or
// heartbeat) to ttl the next is due.
func (e *Entry) interval(ttl time.Duration) time.Duration {
	if e.every > 0 {
		return e.every
	}
	return ttl / 3
}

// Add registers e, scheduled after a call sent at sent set its lease (or
// heartbeat) to ttl. It reports false, and registers nothing, when the
// Client is closed.
func (w *Watchdog) Add(e *Entry, sent time.Time, ttl time.Duration) bool {
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

// Rearm moves e's schedule after a call sent at sent set its lease again.
func (w *Watchdog) Rearm(e *Entry, sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.entries[e]; ok && sent.After(e.confirmed) {
		e.set(sent, e.TTL)
		w.pokeIfBefore(e)
	}
}

// Extend moves e's deadline after a call sent at sent made its lease last
// at least lease (the deadline never moves earlier). It reports false, and
// changes nothing, when e is no longer registered: removed, or dropped as
// lost.
func (w *Watchdog) Extend(e *Entry, sent time.Time, lease time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.entries[e]; !ok {
		return false
	}
	e.deadline = maxTime(e.deadline, sent.Add(lease-Drift(lease)))
	if !e.Renew {
		e.due = e.deadline
	}
	w.pokeIfBefore(e)
	return true
}

// pokeIfBefore wakes run when e is due before run would look. w.mu must be
// held.
func (w *Watchdog) pokeIfBefore(e *Entry) {
	if e.due.Before(w.next) || e.deadline.Before(w.next) {
		select {
		case w.poke <- struct{}{}:
		default: // run is already poked
		}
	}
}

// RenewNow has every hold that is renewed sent for renewal at once, and
// those with a renewal in flight again as soon as it answers: a hold
// whose lease ended in Redis is then reported lost by the reply of a
// renewal sent after that, as at any renewal. It costs one renewal per
// hold, never a false loss: the reply decides. Holds with a fixed lease
// are not renewed, and are reported lost at their deadline as always. For
// the testing kit (module redisynctest).
func (w *Watchdog) RenewNow() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	poke := false
	for e := range w.entries {
		if !e.Hold || !e.Renew {
			continue
		}
		if e.busy {
			e.recheck = true
			continue
		}
		e.due = minTime(e.due, now.Add(e.interval(e.TTL)/6)) // must() is now
		poke = true
	}
	if poke {
		select {
		case w.poke <- struct{}{}:
		default:
		}
	}
}

// DropHolds reports every hold lost now, as its deadline passing would,
// and renews none of them again: for the testing kit (module
// redisynctest), whose Kill stands for the death of the Client's process
// and ends its leases in Redis. It returns the first key and the owner of
// each hold of kind kind ("hold" for a lock) that it dropped.
func (w *Watchdog) DropHolds(kind string) (keys, owners []string) {
	var gone []func()
	w.mu.Lock()
	for e := range w.entries {
		if e.Hold {
			delete(w.entries, e)
			gone = append(gone, e.Gone)
			if e.Kind == kind && len(e.Keys) > 0 {
				keys, owners = append(keys, e.Keys[0]), append(owners, e.Owner)
			}
		}
	}
	w.mu.Unlock()
	for _, f := range gone {
		f()
	}
	return keys, owners
}

// Lose reports lost now the hold of owner whose renewal's first key is
// key, of kind kind ("hold" for a lock), as a renewal that found it gone
// would, and reports whether there was one: for the testing kit (module
// redisynctest), which calls it once it has ended that very hold in
// Redis (its owner id is unique to it, so no other hold is lost).
func (w *Watchdog) Lose(kind, key, owner string) bool {
	var gone []func()
	w.mu.Lock()
	for e := range w.entries {
		if e.Hold && e.Kind == kind && e.Owner == owner && len(e.Keys) > 0 && e.Keys[0] == key {
			delete(w.entries, e)
			gone = append(gone, e.Gone)
		}
	}
	w.mu.Unlock()
	for _, f := range gone {
		f()
	}
	return len(gone) > 0
}

// Remove unregisters e; its gone function will not be called.
func (w *Watchdog) Remove(e *Entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.entries, e)
}

// run sends the renewals that are due, and reports lost what is past its
// deadline, until the Client is closed. Then every hold still registered
// is reported lost.
func (w *Watchdog) run() {
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
// returns the entries to renew now that have no renewal in flight, marked
// busy: every entry that must go (see must), and, to fill the calls these
// make, some that may go early (see may).
//
// The rule: every entry within a sixth of its interval of its due time
// goes now (run wakes for the first of them). The script
// calls they need, of at most Batch entries each (per hash slot when
// Sharded), are then filled up to Batch with entries within a third of
// their interval of their due time, those that must go soonest first. An
// entry renewed early is due again an interval after the call's send time,
// like any other. Holds taken one after another, whose due times are
// spread evenly, are then renewed in full calls, about ceil(n/Batch) per
// interval, where taking only the entries that must go would wake run
// for a few of them at a time.
//
// It is bounded: no entry goes later than it must (its deadline, and when
// it is reported lost, do not change), and none goes more than a third of
// its interval before it is due, so that its renewals are at least two
// thirds of an interval apart, where those sent when they must go are five
// sixths apart: at most 1.25 times as frequent, 1.5 times the rate of one
// renewal per interval. No
// call is made for early entries alone: only entries that must go wake
// run, so there is no busy loop.
func (w *Watchdog) collect(now time.Time) []Renewal {
	type group struct {
		must int      // entries of the group that must go
		may  []*Entry // entries that may go early
	}
	var groups map[uint16]*group // by hash slot; all in slot 0 unless Sharded
	var batch []Renewal
	var gone []func()
	w.mu.Lock()
	for e := range w.entries {
		switch {
		case e.Hold && !now.Before(e.deadline):
			delete(w.entries, e)
			gone = append(gone, e.Gone)
		case e.Renew && !e.Until.IsZero() && !now.Before(e.Until):
			// Renewed for as long as it may be: from now on it is
			// a hold with a fixed lease, lost at its deadline.
			e.Renew, e.due = false, e.deadline
		case e.Renew && !e.busy && !now.Before(e.must()):
			batch = append(batch, w.take(e, now))
			if groups == nil {
				groups = make(map[uint16]*group)
			}
			g := groups[w.slot(e)]
			if g == nil {
				g = &group{}
				groups[w.slot(e)] = g
			}
			g.must++
		}
	}
	if len(batch) > 0 {
		// The loop above dropped the lost holds and stopped renewing
		// those past Until.
		for e := range w.entries {
			if e.Renew && !e.busy && now.Before(e.must()) && !now.Before(e.may()) {
				if g := groups[w.slot(e)]; g != nil && g.must%Batch != 0 {
					g.may = append(g.may, e)
				}
			}
		}
		for _, g := range groups {
			room := Batch - g.must%Batch
			if room == Batch || len(g.may) == 0 {
				continue
			}
			if len(g.may) > room {
				slices.SortFunc(g.may, func(a, b *Entry) int { return a.must().Compare(b.must()) })
				g.may = g.may[:room]
			}
			for _, e := range g.may {
				batch = append(batch, w.take(e, now))
			}
		}
	}
	w.mu.Unlock()
	for _, f := range gone {
		f()
	}
	return batch
}

// take marks e busy and returns its renewal, of a batch collected at now.
// w.mu must be held.
func (w *Watchdog) take(e *Entry, now time.Time) Renewal {
	// A hold's renewal is of use until its lease runs out; a waiter's
	// heartbeat for as long as Redis keeps its record (a late one still
	// refreshes it), which is at least a heartbeat from now.
	e.busy = true
	limit := now.Add(e.TTL)
	if e.Hold {
		limit = e.deadline
	}
	ttl := e.TTL
	if e.farewell {
		ttl = 0 // see renew.lua
	}
	e.beat = e.beat || e.waiters != nil
	return Renewal{e: e, Kind: e.Kind, Owner: e.Owner, Keys: e.Keys, TTL: ttl, limit: limit}
}

// slot returns the hash slot by which split groups e's renewals: 0 unless
// Sharded.
func (w *Watchdog) slot(e *Entry) uint16 {
	if !w.cfg.Sharded {
		return 0
	}
	return schema.Slot(e.Keys[0])
}

// must returns from when e's renewal must go: a sixth of its interval
// before it is due. run wakes then.
func (e *Entry) must() time.Time {
	return e.due.Add(-e.interval(e.TTL) / 6)
}

// may returns from when e's renewal may go early, to fill a call made for
// others: a third of its interval before it is due.
func (e *Entry) may() time.Time {
	return e.due.Add(-e.interval(e.TTL) / 3)
}

// sleep returns how long run may sleep: until the next renewal is due or
// the next deadline passes.
func (w *Watchdog) sleep(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	next := now.Add(time.Hour)
	for e := range w.entries {
		if e.Renew && !e.busy && e.must().Before(next) {
			next = e.must()
		}
		if e.Hold && e.deadline.Before(next) {
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
func (w *Watchdog) stop() {
	var gone []func()
	w.mu.Lock()
	w.stopped = true
	for e := range w.entries {
		switch {
		case e.Hold:
			gone = append(gone, e.Gone)
			if e.Release != nil {
				w.held = append(w.held, e.Release)
			}
		case e.waiters != nil && e.beat: // left or not
			w.held = append(w.held, func(ctx context.Context) error {
				farewell := []Renewal{{Kind: e.Kind, Owner: e.Owner, Keys: e.Keys}} // TTL 0: a farewell
				_, _ = w.cfg.Renew(ctx, farewell)
				return nil // no hold: the waiters' entries run out by themselves
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

// Wait waits for the watchdog's goroutine to exit, once the Client's
// context ended, and returns the releases of the holds it dropped (and the
// waiters' farewells), for the Client to send.
func (w *Watchdog) Wait() []func(context.Context) error {
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

// Schedule returns when e runs out in Redis at the earliest (a hold is
// lost then unless renewed), when the last call that set its lease was
// sent, and whether it is still renewed: for tests and introspection.
func (w *Watchdog) Schedule(e *Entry) (deadline, confirmed time.Time, renewed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return e.deadline, e.confirmed, e.Renew
}

// Sleepers returns how many queued calls the watchdog keeps alive, and in
// how many entries: one per lock or semaphore with waiters.
func (w *Watchdog) Sleepers() (calls, entries int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for e := range w.entries {
		calls += len(e.waiters)
	}
	return calls, len(w.waiting)
}
