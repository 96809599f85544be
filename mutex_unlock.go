package redisync

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/schema"
)

// Unlock releases one level of m's hold: of the hold that ctx carries
// (see Lock), or else of the value's hold, whichever goroutine took it.
// The last level releases the lock, which goes to the next fair waiter,
// if any, or wakes a barging waiter of one process. It returns ErrNotHeld
// when m holds nothing (or the hold ctx carries was unlocked already),
// and ErrLockLost when the hold had been lost (the lock may have had
// another owner since). It never touches another owner's hold. A lost hold
// stays the value's until its Unlock, so the Unlock owed to it never
// releases a later hold of m; but, as with a sync.Mutex, an Unlock too
// many without the hold's ctx releases whatever m holds then. Releasing an
// inner level asks nothing of Redis: a loss not noticed yet (Lost still
// open) is reported by the last level's Unlock.
//
// The last level's release is sent even when ctx has ended already (as
// after a deferred Unlock of a call that timed out), with a timeout of its
// own. m forgets the hold before the release is sent: the hold is no longer
// renewed, so when the release fails, or ctx ends before it is confirmed,
// the lock is freed by Redis within one lease; the error says so. A
// release is sent again when its reply is lost; if the lock was taken and
// released again meanwhile, the retry cannot tell that release of the
// hold from its lease running out, and Unlock reports ErrLockLost: never a
// false success.
func (m *Mutex) Unlock(ctx context.Context) error {
	return observed(m.c.observer(), ctx, CallInfo{Op: OpUnlock, Primitive: m.prim, Name: m.name}, m.unlock, nil)
}

// unlock is Unlock, unobserved: a RedMutex releases its node holds with it.
func (m *Mutex) unlock(ctx context.Context) error {
	m.mu.Lock()
	h := holdIn(ctx, &m.holds)
	switch {
	case h == nil:
		h = m.cur
	case h != m.cur:
		h = nil // unlocked already: released, or lost and forgotten
	}
	if err := m.c.usable(); err != nil {
		if h != nil && errors.Is(err, ErrClosed) {
			// Lost with the Client, which may have collected the
			// holds to release already, or not: release it here too
			// (a second release finds nothing).
			m.loseLocked(h)
			m.forgetLocked(h)
		}
		m.mu.Unlock()
		if h != nil && errors.Is(err, ErrClosed) {
			m.c.rt.Cleanup(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
				_, err := m.release(ctx, rdb, h)
				return nil, err
			})
		}
		return m.wrap("unlock", err)
	}
	switch {
	case h == nil:
		m.mu.Unlock()
		return m.wrap("unlock", ErrNotHeld)
	case h.n > 1:
		h.n--
		lost := h.isLost
		m.mu.Unlock()
		if lost {
			return m.wrap("unlock", ErrLockLost)
		}
		return nil
	}
	lost := h.isLost
	m.forgetUntoldLocked(h) // a lost hold was told already
	m.mu.Unlock()

	if lost {
		// Nothing left to protect; remove the hold if it is still
		// there, so that the lock is free sooner.
		m.releaseLost(ctx, h)
		return m.wrap("unlock", ErrLockLost)
	}
	wait, cancel := roundtrip.Releasing(ctx)
	defer cancel()
	res, _, err := m.c.settle(wait, func(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
		res, err := m.release(ctx, rdb, h)
		if res == 2 {
			// Ended, and not by a release known to be this one's: lost.
			// An earlier try whose reply was lost may have released it,
			// and the next holders come and gone since: never a false
			// success.
			res = 0
		}
		return res, err
	}, nil)
	m.told(h, err == nil && res == 0) // found gone: lost, not released
	switch {
	case err != nil:
		return m.wrap("unlock", notConfirmed(err))
	case res == 0:
		return m.wrap("unlock", ErrLockLost)
	}
	return nil
}

// release runs the release script for the hold h, and returns its reply:
// 1 released (now, or by an earlier try), 0 not held, 2 not held and a
// later hold taken since.
func (m *Mutex) release(ctx context.Context, rdb redis.UniversalClient, h *hold) (int64, error) {
	release := releaseArgs{id: h.id, token: h.token, refuse: h.refuse, publish: m.c.publish, mode: "release"}
	res, err := release.call(m.keys).run(ctx, rdb).Int64()
	if err != nil {
		return 0, redisError(err)
	}
	return res, nil
}

// withdrawal is a call that gives up its ticket.
type withdrawal struct {
	ticket string // the call's
	record string // its record in the fair queue; "" when none or unknown
	refuse bool   // a call of the ticket may still be on its way: refuse it from now on
}

// withdraw runs the release script for w in mode "withdraw": the call
// leaves the queue, and the lock goes on if it was handed to the call.
func (m *Mutex) withdraw(ctx context.Context, rdb redis.UniversalClient, w withdrawal) error {
	a := releaseArgs{id: w.ticket, record: w.record, refuse: w.refuse, publish: m.c.publish, mode: "withdraw"}
	if err := a.call(m.keys).run(ctx, rdb).Err(); err != nil {
		return redisError(err)
	}
	return nil
}

// releaseLost removes h, a hold that was lost, from Redis if it is still
// there, so that the lock is free sooner; in the background after
// roundtrip.CleanupWait.
func (m *Mutex) releaseLost(ctx context.Context, h *hold) {
	m.c.rt.Cleanup(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		_, err := m.release(ctx, rdb, &hold{id: h.id, refuse: h.refuse})
		return nil, err
	})
}

// passOn passes on a wake-up of plain waiters that reached the Client on
// channel when none was left to take it (a cancelled Lock; a channel
// being unsubscribed; a reconnect that may have lost it): if channel is a
// lock's grant channel, scripts/wake.lua wakes the next Client recorded as
// having plain waiters while the lock is free. It never waits.
func (c *Client) passOn(channel string) {
	k, ok := schema.LockOfGrantChannel(channel)
	if !ok {
		return
	}
	c.rt.Background(func(ctx context.Context) {
		// Again while Redis cannot serve it for now (a restart, a
		// failover): the release took the record out already.
		_ = c.rt.Persist(ctx, func() error { return wakeCall(k, c.publish).run(ctx, c.rdb).Err() })
	})
}
