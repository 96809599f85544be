package main

import (
	"context"
	"errors"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

// redislockTTL is the lease of a redislock lock, which has no default:
// redsync's default expiry, so that no lease runs out during a run.
const redislockTTL = 8 * time.Second

// redislockLibrary is bsm/redislock polling with a LinearBackoff of the
// given interval ("10ms" or "1ms"), its README's retry strategy.
func redislockLibrary(backoff string) library {
	interval, err := time.ParseDuration(backoff)
	if err != nil {
		panic(err) // a typo in libraries()
	}
	return library{
		name:  "redislock-" + backoff,
		about: "bsm/redislock, LinearBackoff(" + backoff + "), TTL 8 s",
		open: func(addr string, counts *clientCounts) (instance, error) {
			rdb := newGoRedis(addr, counts)
			return &redislockInstance{rdb: rdb, c: redislock.New(rdb), backoff: interval}, nil
		},
		openCluster: func(addrs []string, counts *clientCounts) (instance, error) {
			rdb := newGoRedisCluster(addrs, counts)
			return &redislockInstance{rdb: rdb, c: redislock.New(rdb), backoff: interval}, nil
		},
		redisKey: func(name string) string { return name },
	}
}

// redislockInstance is one redislock Client on its own go-redis client
// (cluster or not: redislock takes a redis.Scripter).
type redislockInstance struct {
	rdb     redis.UniversalClient
	c       *redislock.Client
	backoff time.Duration
}

// Mutex returns an owner of key: it keeps the *redislock.Lock it obtains.
func (r *redislockInstance) Mutex(key string) locker {
	return &redislockLocker{c: r.c, key: key, backoff: r.backoff}
}

// Close closes the go-redis client.
func (r *redislockInstance) Close() error { return r.rdb.Close() }

// redislockLocker adapts redislock to Lock/Unlock.
type redislockLocker struct {
	c       *redislock.Client
	key     string
	backoff time.Duration
	held    *redislock.Lock
}

// Lock obtains the lock, polling every backoff until ctx ends. Obtain
// retries until ctx's deadline, or for the TTL when ctx has none; Lock
// calls it again whenever it gives up before ctx ends.
func (l *redislockLocker) Lock(ctx context.Context) error {
	opts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(l.backoff)}
	for {
		lock, err := l.c.Obtain(ctx, l.key, redislockTTL, opts)
		switch {
		case err == nil:
			l.held = lock
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.Is(err, redislock.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded):
			return err
		}
	}
}

// Unlock releases the lock obtained by Lock.
func (l *redislockLocker) Unlock(ctx context.Context) error {
	lock := l.held
	l.held = nil
	if lock == nil {
		return redislock.ErrLockNotHeld
	}
	return lock.Release(ctx)
}
