package redisync

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/schema"
)

// Handoff gives m's hold to another process, which takes it with Accept:
// it returns the handle to pass to that process. The lock is never held by
// two at once: m gives the hold up first (its Lost channel closes, and m
// holds nothing, whatever its levels), then Redis keeps the hold under the
// handle for one lease (WithFixedLease, or the watchdog lease), for Accept to
// take with a new fencing token. If nobody accepts it in time, it runs out
// as a lost hold does, and the lock is free.
//
// Handoff returns ErrNotHeld when m holds nothing and ErrLockLost when its
// hold had been lost. When the hand-off cannot be confirmed (Redis
// unreachable), m has given the hold up all the same: the error says so,
// and the hold runs out within its lease. It is sent even when ctx has
// ended already, as a release is.
func (m *Mutex) Handoff(ctx context.Context) (string, error) {
	if m.c.observer() == nil {
		return m.handoff(ctx)
	}
	ctx, o := observe(m.c.observer(), ctx, CallInfo{Op: OpHandoff, Primitive: PrimitiveMutex, Name: m.name})
	handle, err := m.handoff(ctx)
	o.end(ctx, true, err, 0)
	return handle, err
}

// handoff is Handoff, unobserved.
func (m *Mutex) handoff(ctx context.Context) (string, error) {
	if err := m.c.usable(); err != nil {
		return "", m.wrap("handoff", err)
	}
	m.mu.Lock()
	h := m.cur
	if h == nil {
		m.mu.Unlock()
		return "", m.wrap("handoff", ErrNotHeld)
	}
	lost := h.isLost
	h.given = !lost
	m.loseLocked(h) // the holder stops believing before anyone else can
	m.forgetLocked(h)
	m.mu.Unlock()
	if lost {
		// Nothing to hand off; free the lock sooner, as Unlock does.
		m.releaseLost(ctx, h)
		return "", m.wrap("handoff", ErrLockLost)
	}

	handle := schema.HandoffPrefix + m.c.ticket(m.cfg.label)
	wait, cancel := roundtrip.Releasing(ctx)
	defer cancel()
	res, _, err := m.c.settle(wait, func(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
		give := handoffGiveArgs{id: h.id, handle: handle, lease: m.cfg.holdLease(), refuse: h.refuse}
		res, err := give.call(m.keys).run(ctx, rdb).Int64Slice()
		if err != nil {
			return 0, err
		}
		return res[0], nil
	}, nil)
	m.told(h, err == nil && res == 0) // found gone: lost, not handed off
	switch {
	case err != nil:
		return "", m.wrap("handoff", unconfirmed(err, "the hand-off too; the hold is given up, and runs out within its lease"))
	case res == 0:
		return "", m.wrap("handoff", ErrLockLost)
	}
	return handle, nil
}

// Accept takes the hold that another process gave up with Handoff, under
// handle, with a new fencing token and a lease of m's own, renewed as a
// Lock's is. It returns ErrNotHeld when no hold waits under handle (it ran
// out, was taken already, or never was), ErrHeld, before any call to
// Redis, when m holds the lock already, and the errors of Redis. Like
// Lock, it returns within 25 ms of ctx's end and leaves nothing behind.
func (m *Mutex) Accept(ctx context.Context, handle string) error {
	return observed(m.c.observer(), ctx, CallInfo{Op: OpAccept, Primitive: PrimitiveMutex, Name: m.name}, func(ctx context.Context) error { return m.accept(ctx, handle) }, m.Token)
}

// accept is Accept, unobserved.
func (m *Mutex) accept(ctx context.Context, handle string) error {
	if err := m.usable(ctx); err != nil {
		return m.wrap("accept", err)
	}
	leave, err := m.c.enter(ctx, m.keys.GrantChannel(m.c.id))
	if err != nil {
		return m.wrap("accept", err)
	}
	defer leave()
	if !strings.HasPrefix(handle, schema.HandoffPrefix) {
		return m.wrap("accept", fmt.Errorf("%w: %q is not a handle from Handoff", ErrNotHeld, handle))
	}
	if m.current() != nil {
		return m.wrap("accept", ErrHeld)
	}
	ctx, stop := roundtrip.Marked(ctx)
	defer stop()
	l := &lockCall{m: m, ticket: m.c.ticket(m.cfg.label), mode: "accept", place: place{wd: m.c.wd}}
	take := handoffTakeArgs{handle: handle, ticket: l.ticket, lease: m.cfg.holdLease(), metadata: m.cfg.metadata}.call(m.keys)
	sent := time.Now()
	res, abandoned, err := m.c.rt.Attempt(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return m.c.runAcked(ctx, rdb, m.cfg, take, granted)
	}, l.late(l.ticket))
	switch {
	case abandoned:
		return m.wrap("accept", err)
	case err != nil:
		l.failed(err, false)
		l.finish(ctx, err)
		return m.wrap("accept", redisError(err))
	case res[0] == 0:
		return m.wrap("accept", ErrNotHeld)
	}
	ok, _, err := l.take(ctx, res[1], sent, m.cfg.holdLease(), true)
	switch {
	case err != nil:
		return m.wrap("accept", err)
	case !ok: // its lease ran out before the reply came; given back
		return m.wrap("accept", ErrLockLost)
	}
	return nil
}
