package watchdog

import (
	"time"

	"github.com/redisync/redisync/internal/waiters"
)

// stamp is a heartbeat of waiters: when it was sent, and the server time
// (ms) at which it ran.
type stamp struct {
	sent time.Time
	ms   int64
}

// Join keeps the queued call of ws alive, with the Client's other waiters
// on the same queue (kind "wait" for a fair lock's, "swait" for a
// semaphore's; owner: the Client's id; name: of what they wait for, for
// events; keys: the queue, the waiters' records, and what they wait for).
// One heartbeat serves them all: it moves the Client's deadline in the
// lock's or semaphore's hash (scripts/lib.lua, CLIENT_FIELD) every ttl/3, and nudges
// them all when they must look again. every is how often: at most ttl/3,
// and less when a hold handed to them has a shorter lease (see
// place.confirmed). sent is when the attempt that queued the call was sent:
// its own deadline in Redis lasts ttl from then. It returns the entry, or
// nil when the Client is closed.
func (w *Watchdog) Join(kind, owner, name string, keys []string, ttl, every time.Duration, sent time.Time, ws *waiters.Set) *Entry {
	key := kind + " " + keys[0]
	w.mu.Lock()
	e := w.waiting[key]
	if e != nil {
		e.waiters[ws] = SafeUntil(sent, ttl)
		e.TTL, e.every = min(e.TTL, ttl), min(e.every, every)
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
	e = &Entry{Kind: kind, Owner: owner, Name: name, Keys: keys, TTL: ttl, every: every, Renew: true,
		waiters: map[*waiters.Set]time.Time{ws: SafeUntil(sent, ttl)}}
	if !w.Add(e, sent, ttl) {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if other := w.waiting[key]; other != nil {
		// Another call of the Client joined meanwhile: share its entry.
		delete(w.entries, e)
		other.waiters[ws] = SafeUntil(sent, ttl)
		other.TTL, other.every = min(other.TTL, ttl), min(other.every, every)
		if due := sent.Add(every); due.Before(other.due) {
			other.due = due
			w.pokeIfBefore(other)
		}
		return other
	}
	w.waiting[key] = e
	return e
}

// SafeUntil returns until when the own deadline of a waiter queued by an
// attempt sent at sent, with heartbeat ttl, surely lasts in Redis: every
// queueing attempt writes the waiter's deadline, ttl after it ran, and it
// ran after it was sent (less a margin for clock drift). Until then no
// script drops the waiter as dead, whatever its Client's deadline says.
func SafeUntil(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - Drift(ttl))
}

// Leave stops keeping ws's call alive on e. The entry goes with its last
// call; if a heartbeat wrote the Client's deadline, it is removed from
// Redis by one more call in the next batch (a farewell), so that a lock
// in constant use does not gather the deadlines of Clients that waited on
// it once. (A release that drops a dead Client's waiter removes that
// Client's deadline; one that dies between its last waiter leaving and the
// farewell, or whose live-looking waiter is handed the lock, leaves it
// until the lock is idle for two heartbeats: see docs/design.md.)
func (w *Watchdog) Leave(e *Entry, ws *waiters.Set) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(e.waiters, ws)
	key := e.Kind + " " + e.Keys[0]
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

// RanBefore returns the send time of the last heartbeat of e that Redis
// ran before the server time ms, or the zero time if none is known. A
// hand-off (or grant) at ms came later than that heartbeat was sent: the
// lease it gave lasts at least that long from then. (Redis expires keys by
// the same clock, so if the clock stepped back and a heartbeat that ran
// after the hand-off seems earlier, the lease ends later by as much.)
func (w *Watchdog) RanBefore(e *Entry, ms int64) time.Time {
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
