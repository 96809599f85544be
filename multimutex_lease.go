package redisync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Extend makes the hold of every name of m last at least lease from now,
// as Mutex.Extend does for one name: each name's lease in Redis is set to
// lease, counted from when Redis runs its call, unless more than that is
// left already (Extend never shortens a lease), and each name's local
// deadline is counted from when its call was sent. The names are extended
// all at once, one call per name.
//
// Extend returns an error wrapping ErrInvalidOption, before any call to
// Redis, when lease is outside [1ms, MaxLease]; ErrNotHeld when m holds
// nothing, and ErrLockLost when its hold was lost, before any call to
// Redis too; and ErrLockLost when Redis no longer has a name's hold (Lost
// is closed then). On other errors (ctx ended, an error from Redis,
// ErrNotReplicated) the names whose call failed may or may not have been
// extended in Redis, and their local deadlines are not moved, as with
// Mutex.Extend; the error joins those of the names that failed. It
// returns ErrClosed after Close. It is safe for concurrent use.
func (m *MultiMutex) Extend(ctx context.Context, lease time.Duration) error {
	return observed(m.c.observer(), ctx, m.call(OpExtend), func(ctx context.Context) error { return m.extend(ctx, lease) }, nil)
}

// extend is Extend, unobserved.
func (m *MultiMutex) extend(ctx context.Context, lease time.Duration) error {
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
	errs := make([]error, len(h.parts))
	var wg sync.WaitGroup
	for i, l := range h.parts {
		wg.Go(func() { errs[i] = l.extend(ctx, lease) })
	}
	wg.Wait()
	return m.wrapIf("extend", errors.Join(errs...))
}

// TTL returns the least lease left among the holds of m's names in Redis
// (each name's PTTL, as Mutex.TTL returns it), asked all at once: the set
// is held for at least that long by the server's clock. To stop work in
// time, watch Lost, whose local deadlines allow for the round trips and
// clock drift.
//
// TTL returns 0 and an error wrapping ErrNotHeld when m holds nothing, and
// ErrLockLost when its hold was lost, without a call to Redis; ErrLockLost
// when Redis no longer has a name's hold (Lost is closed then); ctx's
// error when ctx ends first; ErrClosed after Close; and the errors of
// Redis. It is safe for concurrent use.
func (m *MultiMutex) TTL(ctx context.Context) (time.Duration, error) {
	var ttl time.Duration
	err := observed(m.c.observer(), ctx, m.call(OpTTL), func(ctx context.Context) (err error) {
		ttl, err = m.ttl(ctx)
		return err
	}, nil)
	return ttl, err
}

// ttl is TTL, unobserved.
func (m *MultiMutex) ttl(ctx context.Context) (time.Duration, error) {
	if err := m.usable(ctx); err != nil {
		return 0, m.wrap("ttl", err)
	}
	h, err := m.held()
	if err != nil {
		return 0, m.wrap("ttl", err)
	}
	ttls, errs := make([]time.Duration, len(h.parts)), make([]error, len(h.parts))
	var wg sync.WaitGroup
	for i, l := range h.parts {
		wg.Go(func() { ttls[i], errs[i] = l.ttl(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, m.wrap("ttl", err)
	}
	return slices.Min(ttls), nil
}

// held returns m's hold, or why there is none to act on: ErrNotHeld, or
// ErrLockLost when it was lost.
func (m *MultiMutex) held() (*hold, error) {
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
