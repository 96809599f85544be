package watchdog

import (
	"context"
	"fmt"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Renewal is one entry of a batch, with what the renew script needs of it
// (read under w.mu when the batch was collected).
type Renewal struct {
	Kind  string        // the entry's kind in renew.lua
	Owner string        // its owner id; the Client's id for waiters
	Keys  []string      // its keys, in order
	TTL   time.Duration // the lease or heartbeat to set; 0: a farewell of waiters

	e     *Entry
	limit time.Time // when a reply is of no more use
}

// split cuts a batch into script calls of at most Batch entries.
// On a Redis Cluster each call holds entries of one hash slot only, as a
// script may only touch keys of one slot.
func (w *Watchdog) split(batch []Renewal) [][]Renewal {
	if len(batch) == 0 {
		return nil
	}
	groups := [][]Renewal{batch}
	if w.cfg.Sharded {
		bySlot := make(map[uint16][]Renewal)
		for _, r := range batch {
			slot := schema.Slot(r.Keys[0])
			bySlot[slot] = append(bySlot[slot], r)
		}
		groups = groups[:0]
		for _, g := range bySlot {
			groups = append(groups, g)
		}
	}
	var parts [][]Renewal
	for _, g := range groups {
		for len(g) > 0 {
			n := min(len(g), Batch)
			parts = append(parts, g[:n])
			g = g[n:]
		}
	}
	return parts
}

// send renews a batch in one script call, from a goroutine of its own, and
// applies the result.
func (w *Watchdog) send(batch []Renewal) {
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.renew(batch)
	}()
}

// renew renews a batch in one script call and applies the result.
func (w *Watchdog) renew(batch []Renewal) {
	sent := time.Now()
	limit := sent.Add(time.Hour)
	for _, r := range batch {
		limit = minTime(limit, r.limit)
	}
	res, err := w.call(limit, batch)
	if err != nil && w.cfg.Reload != nil {
		// The slot's primary may have failed over: have the client look
		// for the new one before the retry.
		w.cfg.Reload()
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
		recheck := e.recheck
		e.recheck = false
		if _, ok := w.entries[e]; !ok {
			continue // released or lost meanwhile
		}
		switch {
		case e.farewell && r.TTL == 0:
			delete(w.entries, e) // sent once, whatever came of it
		case e.farewell:
			// A heartbeat sent before the last waiter left: the farewell
			// goes next.
		case err == nil && e.waiters != nil:
			e.set(sent, e.TTL)
			copy(e.ran[:], e.ran[1:])
			e.ran[len(e.ran)-1] = stamp{sent: sent, ms: res[len(batch)]}
			for ws, safe := range e.waiters {
				// 3: the Client's deadline had passed, or was not there
				// yet (its first heartbeats), so that a release may
				// have dropped as dead a waiter whose own deadline had
				// passed too; one whose own has not passed by now cannot
				// have been, and sleeps on. 2 and 0: every waiter looks.
				if res[i] == 2 || res[i] == 0 || (res[i] == 3 && !now.Before(safe)) {
					gone = append(gone, ws.Nudge)
				}
			}
		case err == nil && res[i] == 1:
			e.set(sent, e.TTL)
			if recheck {
				// RenewNow came while this renewal was out: it may
				// have run before the lease ended in Redis.
				e.due = minTime(e.due, now.Add(e.interval(e.TTL)/6))
			}
		case err == nil:
			delete(w.entries, e)
			gone = append(gone, e.Gone)
		default:
			// Try again soon; run reports the hold lost if its
			// deadline passes first. A heartbeat of waiters may have run
			// without its reply arriving: they look again, in case it
			// found their Client's deadline passed.
			e.due = now.Add(min(max(e.TTL/10, time.Millisecond), time.Second))
			for ws := range e.waiters {
				gone = append(gone, ws.Nudge)
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
func (w *Watchdog) told(batch []Renewal, res []int64, err error, latency time.Duration) {
	ev := w.cfg.Events
	if ev == nil {
		return
	}
	if err != nil {
		if w.ctx.Err() == nil { // not the Client's Close
			ev.RenewFailed(len(batch), latency, err)
		}
		return
	}
	ev.Renewed(len(batch), latency)
	var seen map[string]bool
	for i, r := range batch {
		if res[i] != 2 || seen[r.Keys[0]] {
			continue
		}
		if seen == nil {
			seen = make(map[string]bool)
		}
		seen[r.Keys[0]] = true
		ev.DeadWaiter(r.Kind, r.e.Name)
	}
}

// call runs the renew script on batch, giving up at limit: a renewal that
// has not answered by the first deadline of its batch is of no use.
// go-redis bounds a call by its context only when the go-redis client was
// built with ContextTimeoutEnabled, so the call runs in a goroutine of its
// own and the watchdog stops waiting for it at limit; go-redis's own
// timeouts end it later (Wait waits for it). A renewal that reaches Redis
// after limit only delays other owners.
//
// The context ends at limit, at Close, or once call returns, never when
// Renew returns: a caller that reaches its select late (a loaded machine)
// would find both the reply and the context ended, and might pick the
// context's "context canceled" over a renewal that answered in time.
func (w *Watchdog) call(limit time.Time, batch []Renewal) ([]int64, error) {
	ctx, cancel := context.WithDeadline(w.ctx, limit)
	defer cancel()
	type reply struct {
		res []int64
		err error
	}
	done := make(chan reply, 1)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		res, err := w.cfg.Renew(ctx, batch)
		done <- reply{res, err}
	}()
	select {
	case r := <-done:
		return r.res, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
