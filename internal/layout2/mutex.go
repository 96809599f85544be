package layout2

import (
	"context"
	"sync"
	"time"
)

// Mutex is a layout-2 fair lock of one name: one owner, as one goroutine
// uses it (it is safe for concurrent use, but holds one hold at a time).
type Mutex struct {
	c *Client
	k keys

	mu    sync.Mutex
	id    string // the ticket of the hold; "" when none
	token int64  // its fencing token
}

// NewMutex returns a Mutex for the lock called name. It does no I/O.
func (c *Client) NewMutex(name string) *Mutex {
	return &Mutex{c: c, k: lockKeys(c.prefix, name)}
}

// Lock blocks until the lock is held, ctx ends (ctx.Err()) or the Client is
// closed (ErrClosed); then, and after an error of Redis, it withdraws the
// call from the queue, giving back the lock if it was handed to the call
// meanwhile.
func (m *Mutex) Lock(ctx context.Context) error {
	if err := m.c.usable(ctx); err != nil {
		return err
	}
	l := &lockCall{m: m, ticket: m.c.ticket()}
	err := l.run(ctx)
	l.end(ctx, err)
	return err
}

// TryLock makes one attempt to take the lock, behind the fair queue, and
// reports whether it is held now.
func (m *Mutex) TryLock(ctx context.Context) (bool, error) {
	if err := m.c.usable(ctx); err != nil {
		return false, err
	}
	ticket := m.c.ticket()
	res, err := m.c.acquire(ctx, m.k, ticket, "try", false)
	if err != nil {
		m.c.withdraw(ctx, m.k, ticket) // it may have run
		return false, err
	}
	if res[0] != 1 {
		return false, nil
	}
	m.take(ticket, res[1])
	return true, nil
}

// Unlock releases the hold, which goes to the first live fair waiter. It
// returns ErrNotHeld when m holds nothing, and ErrLost when Redis no longer
// had the hold. m forgets the hold first, whatever comes of the release.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	id, token := m.id, m.token
	m.id, m.token = "", 0
	m.mu.Unlock()
	if id == "" {
		return ErrNotHeld
	}
	n, err := m.c.release(ctx, m.k, id, token, "release")
	switch {
	case err != nil:
		return err
	case n == 0:
		return ErrLost
	}
	return nil
}

// Token returns the fencing token of m's hold, or 0 when m holds nothing.
func (m *Mutex) Token() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.token
}

// take makes the hold of ticket m's.
func (m *Mutex) take(ticket string, token int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.id, m.token = ticket, token
}

// lockCall is one Lock call.
type lockCall struct {
	m      *Mutex
	ticket string
	sent   bool    // an attempt was sent: the call may be queued, or granted
	w      *waiter // registered on the Client's grant channel of the lock
}

// run is the wait loop of the library's block: attempt; if the lock is
// not granted, subscribe (unless other waiters of the Client keep the
// channel subscribed) and attempt again; then sleep until a grant, a
// heartbeat's nudge, or the lock's PTTL or the recheck interval, whichever
// is shorter, and attempt again.
func (l *lockCall) run(ctx context.Context) error {
	c, k := l.m.c, l.m.k
	channel := k.grantChannel(c.id)
	var err error
	if l.w, _, err = c.join(channel, l.ticket, true); err != nil {
		return err
	}
	queued := false
	for {
		sent := time.Now()
		l.sent = true
		res, err := c.acquire(ctx, k, l.ticket, "queue", queued)
		if err != nil {
			return err
		}
		switch res[0] {
		case 1:
			l.m.take(l.ticket, res[1])
			return nil
		case -2, -3:
			// The ticket left the queue, or was withdrawn: go on under a
			// new one, so that a grant to the old one is never taken.
			queued = false
			l.ticket = c.ticket()
			if l.w != nil {
				c.stopKeepAlive(l.w)
				c.retarget(l.w, l.ticket)
			}
			continue
		}
		queued = true
		if l.w == nil {
			w, ready, err := c.join(channel, l.ticket, false)
			if err != nil {
				return err
			}
			l.w = w
			select {
			case <-ready:
			case <-ctx.Done():
				return ctx.Err()
			case <-c.ctx.Done():
				return ErrClosed
			}
			continue
		}
		c.keepAlive(l.w, k, sent)
		t := time.NewTimer(sleepFor(res[1]))
		select {
		case msg := <-l.w.grant:
			if ticket, token, ok := parseGrant(msg); ok && ticket == l.ticket {
				t.Stop()
				l.m.take(l.ticket, token)
				return nil
			}
		case <-l.w.nudge:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-c.ctx.Done():
			t.Stop()
			return ErrClosed
		}
		t.Stop()
	}
}

// end withdraws a call that failed after sending an attempt, then
// unregisters its waiter.
func (l *lockCall) end(ctx context.Context, err error) {
	if err != nil && l.sent {
		l.m.c.withdraw(ctx, l.m.k, l.ticket)
	}
	if l.w != nil {
		l.m.c.leave(l.w)
	}
}

// sleepFor is how long a waiter sleeps at most after an attempt found the
// lock held with the PTTL pttl (-1: no TTL; -2: gone since).
func sleepFor(pttl int64) time.Duration {
	switch {
	case pttl == -2:
		return time.Millisecond
	case pttl < 0:
		return recheck
	}
	return min(max(time.Duration(pttl)*time.Millisecond, time.Millisecond), recheck)
}

// acquire runs acquire.lua for ticket in mode mode ("queue" or "try");
// queued: an earlier attempt of the call queued the ticket.
func (c *Client) acquire(ctx context.Context, k keys, ticket, mode string, queued bool) ([]int64, error) {
	q := "0"
	if queued {
		q = "1"
	}
	return scripts.acquire.Run(ctx, c.rdb,
		[]string{k.hash, k.token, k.queue, k.waiters, k.tombstone(ticket), k.bargers},
		ticket, lease.Milliseconds(), mode, heartbeat.Milliseconds(), handoffLease.Milliseconds(),
		k.channel, publish, q, "", int64(0), "0").Int64Slice()
}

// release runs release.lua for the hold (or ticket) id in mode mode
// ("release" or "withdraw"); token is the hold's, 0 when unknown.
func (c *Client) release(ctx context.Context, k keys, id string, token int64, mode string) (int64, error) {
	return scripts.release.Run(ctx, c.rdb,
		[]string{k.hash, k.token, k.queue, k.waiters, k.tombstone(id), k.bargers},
		id, token, tombstoneTTL.Milliseconds(), k.channel, publish, mode).Int64()
}

// withdraw withdraws ticket from the lock k, even after ctx ended.
func (c *Client) withdraw(ctx context.Context, k keys, ticket string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupLimit)
	defer cancel()
	_, _ = c.release(ctx, k, ticket, 0, "withdraw")
}
