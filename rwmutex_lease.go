package redisync

import (
	"cmp"
	"context"
	"time"
)

// Extend makes the lease of rw's write last at least lease from now, as
// Semaphore.Extend does for permits (and Mutex.Extend for a hold): it
// never shortens the lease, and when it returns nil, Lost does not close
// until lease (less the drift margin) has passed since the call was sent,
// unless the write is found removed behind rw's back. A read has no
// Extend.
//
// Extend returns an error wrapping ErrInvalidOption, before any call to
// Redis, when lease is outside [1ms, MaxLease]; ErrNotHeld when rw holds
// no write; ErrLockLost when the write was lost or Redis no longer has it
// (Lost is closed then); ErrClosed after Close; and ctx's error or the
// errors of Redis, after which the lease may or may not have been
// extended in Redis and the local deadline is not moved.
func (rw *RWMutex) Extend(ctx context.Context, lease time.Duration) error {
	return observed(rw.c.observer(), ctx, rw.call(OpExtend), func(ctx context.Context) error {
		if err := cmp.Or(rw.c.usable(), ctx.Err()); err != nil {
			return rw.wrap(OpExtend, err)
		}
		w := rw.current()
		if w == nil {
			// The lease is checked first, as a write's Extend does.
			if err := checkLease(lease); err != nil {
				return rw.wrap(OpExtend, err)
			}
			return rw.wrap(OpExtend, ErrNotHeld)
		}
		return rw.wrap(OpExtend, w.s.extend(ctx, lease))
	}, nil)
}

// TTL returns what is left of the lease of rw's write in Redis, by the
// server's clock when it ran the call, as Semaphore.TTL does. It returns 0
// and an error wrapping ErrNotHeld when rw holds no write, without a call
// to Redis; ErrLockLost when the write was lost or Redis no longer has it
// (Lost is closed then); ErrClosed after Close; and ctx's error or the
// errors of Redis.
func (rw *RWMutex) TTL(ctx context.Context) (time.Duration, error) {
	var ttl time.Duration
	err := observed(rw.c.observer(), ctx, rw.call(OpTTL), func(ctx context.Context) (err error) {
		if err := cmp.Or(rw.c.usable(), ctx.Err()); err != nil {
			return rw.wrap(OpTTL, err)
		}
		w := rw.current()
		if w == nil {
			return rw.wrap(OpTTL, ErrNotHeld)
		}
		ttl, err = w.s.ttl(ctx)
		return rw.wrap(OpTTL, err)
	}, nil)
	return ttl, err
}
