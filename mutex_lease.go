package redisync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Extend makes m's hold last at least lease from now: it sets the hold's
// lease in Redis to lease, counted from when Redis runs the call, unless
// more than that is left already (Extend never shortens a lease). Redis is
// asked by m's hold id, so another owner's hold is never touched.
//
// When Extend returns nil, Lost does not close until lease (less the drift
// margin, 1% + 2 ms) has passed since the call was sent, unless the hold
// is found removed behind m's back: the local deadline is counted from the
// sending, never from the reply, so that it still comes before Redis can
// let anyone else in, at any latency.
//
// With a fixed lease (WithFixedLease), Extend is how a hold is kept past its
// lease. Under the watchdog it gives a one-off longer lease: the watchdog
// goes on renewing the hold at its usual lease and interval, and a renewal
// never cuts the longer lease short, so the hold outlasts failing renewals
// (or this process) until lease has passed. WithMaxHold does not cap
// Extend, which is the holder's own call.
//
// Extend returns an error wrapping ErrInvalidOption, before any call to
// Redis, when lease is outside [1ms, MaxLease]; ErrNotHeld when m holds
// nothing; and ErrLockLost when the hold was lost or Redis no longer has
// it (Lost is closed then). When ctx ends first (Extend returns within
// 25 ms), on an error from Redis, or, with WithReplicas, when too few
// replicas acknowledged (ErrNotReplicated), the lease may or may not have
// been extended in Redis, and the local deadline is not moved: a lease in
// Redis only ever grows, so either way the hold is lost locally before
// Redis lets it go. It returns ErrClosed after Close. It is safe for
// concurrent use.
func (m *Mutex) Extend(ctx context.Context, lease time.Duration) error {
	return observed(m.c.observer(), ctx, CallInfo{Op: OpExtend, Primitive: m.prim, Name: m.name}, func(ctx context.Context) error { return m.extend(ctx, lease) }, nil)
}

// extend is Extend, unobserved.
func (m *Mutex) extend(ctx context.Context, lease time.Duration) error {
	if err := m.usable(ctx); err != nil {
		return m.wrap("extend", err)
	}
	if lease < minDuration || lease > MaxLease {
		return m.wrap("extend", fmt.Errorf("%w: lease %v is outside [%v, %v]", ErrInvalidOption, lease, minDuration, MaxLease))
	}
	h, err := m.held()
	if err != nil {
		return m.wrap("extend", err)
	}
	ms := lease.Milliseconds() // Redis counts whole ms; so does the deadline
	sent := time.Now()
	res, _, err := m.c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return m.c.runAcked(ctx, rdb, m.cfg, extendArgs{id: h.id, lease: lease}.call(m.keys), granted)
	}, nil)
	switch {
	case err != nil:
		return m.wrap("extend", redisError(err))
	case len(res) == 0 || res[0] != 1:
		m.lose(h)
		return m.wrap("extend", ErrLockLost)
	case !m.c.wd.Extend(h.ka, sent, time.Duration(ms)*time.Millisecond):
		// Unlocked, or lost, while the call was out.
		return m.wrap("extend", m.gone(h))
	}
	return nil
}

// TTL returns what is left of m's hold's lease in Redis (its PTTL, asked
// by m's hold id), by the server's clock when it ran the call: when TTL
// returns, up to a round trip less is left. To stop work in time, watch
// Lost, whose local deadline allows for that and for clock drift. Under
// the watchdog the lease left is between about two thirds of the watchdog
// lease and all of it, unless Extend set more.
//
// TTL returns 0 and an error wrapping ErrNotHeld when m holds nothing,
// without a call to Redis; ErrLockLost when the hold was lost, or Redis no
// longer has it (Lost is closed then); ctx's error when ctx ends first
// (within 25 ms); ErrClosed after Close; and the errors of Redis. It is
// safe for concurrent use.
func (m *Mutex) TTL(ctx context.Context) (time.Duration, error) {
	var ttl time.Duration
	err := observed(m.c.observer(), ctx, CallInfo{Op: OpTTL, Primitive: m.prim, Name: m.name}, func(ctx context.Context) (err error) {
		ttl, err = m.ttl(ctx)
		return err
	}, nil)
	return ttl, err
}

// ttl is TTL, unobserved.
func (m *Mutex) ttl(ctx context.Context) (time.Duration, error) {
	if err := m.usable(ctx); err != nil {
		return 0, m.wrap("ttl", err)
	}
	h, err := m.held()
	if err != nil {
		return 0, m.wrap("ttl", err)
	}
	res, _, err := m.c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return ttlArgs{id: h.id}.call(m.keys).run(ctx, rdb).Int64Slice()
	}, nil)
	switch {
	case err != nil:
		return 0, m.wrap("ttl", redisError(err))
	case len(res) == 0 || res[0] == -2:
		m.lose(h)
		return 0, m.wrap("ttl", ErrLockLost)
	case res[0] < 0:
		return 0, m.wrap("ttl", errors.New("the lock's key has no TTL: a command outside redisync removed it"))
	}
	return time.Duration(res[0]) * time.Millisecond, nil
}

// held returns m's hold, or why there is none to act on: ErrNotHeld, or
// ErrLockLost when it was lost.
func (m *Mutex) held() (*hold, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.cur == nil:
		return nil, ErrNotHeld
	case m.cur.isLost:
		return nil, ErrLockLost
	}
	return m.cur, nil
}

// gone says why h, m's hold when a call about it was sent, is no longer
// registered with the watchdog: lost (it may be m's hold still, its Lost
// about to close), or released.
func (m *Mutex) gone(h *hold) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == h || h.isLost {
		return ErrLockLost
	}
	return ErrNotHeld
}
