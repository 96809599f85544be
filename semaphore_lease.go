package redisync

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Extend makes the lease of the permits s holds last at least lease from
// now: it sets their lease in Redis to lease, counted from when Redis runs
// the call, unless more than that is left already (Extend never shortens a
// lease). Redis is asked by s's holding id, so another holder's permits
// are never touched.
//
// When Extend returns nil, Lost does not close until lease (less the drift
// margin, 1% + 2 ms) has passed since the call was sent, unless the
// permits are found removed behind s's back: the local deadline is counted
// from the sending, never from the reply. With a fixed lease
// (WithFixedLease), Extend is how permits are kept past their lease; under
// the watchdog it gives a one-off longer lease, which renewals never cut
// short. WithMaxHold does not cap Extend.
//
// Extend returns an error wrapping ErrInvalidOption, before any call to
// Redis, when lease is outside [1ms, MaxLease]; ErrNotHeld when s holds no
// permits; and ErrLockLost when its permits were lost or Redis no longer
// has them (Lost is closed then). When ctx ends first, on an error from
// Redis, or, with WithReplicas, when too few replicas acknowledged
// (ErrNotReplicated), the lease may or may not have been extended in
// Redis, and the local deadline is not moved. It returns ErrClosed after
// Close. It is safe for concurrent use.
func (s *Semaphore) Extend(ctx context.Context, lease time.Duration) error {
	return observed(s.c.observer(), ctx, CallInfo{Op: OpExtend, Primitive: PrimitiveSemaphore, Name: s.name}, func(ctx context.Context) error {
		if err := s.extend(ctx, lease); err != nil {
			return s.wrap("extend", err)
		}
		return nil
	}, nil)
}

// TTL returns what is left of the lease of the permits s holds in Redis,
// by the server's clock when it ran the call: when TTL returns, up to a
// round trip less is left. To stop work in time, watch Lost.
//
// TTL returns 0 and an error wrapping ErrNotHeld when s holds no permits,
// without a call to Redis; ErrLockLost when its permits were lost, or
// Redis no longer has them (Lost is closed then); ctx's error when ctx
// ends first; ErrClosed after Close; and the errors of Redis. It is safe
// for concurrent use.
func (s *Semaphore) TTL(ctx context.Context) (time.Duration, error) {
	var ttl time.Duration
	err := observed(s.c.observer(), ctx, CallInfo{Op: OpTTL, Primitive: PrimitiveSemaphore, Name: s.name}, func(ctx context.Context) (err error) {
		if ttl, err = s.ttl(ctx); err != nil {
			return s.wrap("ttl", err)
		}
		return nil
	}, nil)
	return ttl, err
}

// extend is Extend, unobserved and unwrapped.
func (s *Semaphore) extend(ctx context.Context, lease time.Duration) error {
	if err := cmp.Or(s.c.usable(), ctx.Err()); err != nil {
		return err
	}
	if err := checkLease(lease); err != nil {
		return err
	}
	h, err := s.held()
	if err != nil {
		return err
	}
	ms := lease.Milliseconds() // Redis counts whole ms; so does the deadline
	sent := time.Now()
	res, _, err := s.c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return s.c.runAcked(ctx, rdb, s.cfg, semLeaseArgs{holder: h.id, mode: "extend", lease: lease}.call(s.keys), granted)
	}, nil)
	switch {
	case err != nil:
		return redisError(err)
	case len(res) == 0 || res[0] != 1:
		s.lose(h)
		return ErrLockLost
	case !s.c.wd.Extend(h.ka, sent, time.Duration(ms)*time.Millisecond):
		// Released, or lost, while the call was out.
		return s.gone(h)
	}
	return nil
}

// ttl is TTL, unobserved and unwrapped.
func (s *Semaphore) ttl(ctx context.Context) (time.Duration, error) {
	if err := cmp.Or(s.c.usable(), ctx.Err()); err != nil {
		return 0, err
	}
	h, err := s.held()
	if err != nil {
		return 0, err
	}
	res, _, err := s.c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return semLeaseArgs{holder: h.id, mode: "ttl"}.call(s.keys).run(ctx, rdb).Int64Slice()
	}, nil)
	switch {
	case err != nil:
		return 0, redisError(err)
	case len(res) == 0 || res[0] < 0:
		s.lose(h)
		return 0, ErrLockLost
	}
	return time.Duration(res[0]) * time.Millisecond, nil
}

// checkLease reports a lease for Extend outside [1ms, MaxLease].
func checkLease(lease time.Duration) error {
	if lease < minDuration || lease > MaxLease {
		return fmt.Errorf("%w: lease %v is outside [%v, %v]", ErrInvalidOption, lease, minDuration, MaxLease)
	}
	return nil
}

// held returns s's holding, or why there is none to act on: ErrNotHeld,
// or ErrLockLost when it was lost.
func (s *Semaphore) held() (*hold, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.cur == nil:
		return nil, ErrNotHeld
	case s.cur.isLost:
		return nil, ErrLockLost
	}
	return s.cur, nil
}

// gone says why h, s's holding when a call about it was sent, is no
// longer registered with the watchdog: lost, or released.
func (s *Semaphore) gone(h *hold) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == h || h.isLost {
		return ErrLockLost
	}
	return ErrNotHeld
}
