package main

import (
	"context"
	"errors"

	"github.com/redisync/redisync/internal/schema"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// redisyncSemaphore is the hook of the semaphore scenario: it returns a
// holder of one permit of the redisync semaphore called name, which has
// size permits, on Client c: a Semaphore value of its own, so every
// goroutine is one holder. When it is nil, redisync sits out the semaphore
// scenario.
//
// Only redisync (not redisync-barging) runs it: Barging is no option of a
// semaphore.
var redisyncSemaphore = func(c *redisync.Client, name string, size int64) locker {
	return semaphoreLocker{made(c.NewSemaphore(name, size))}
}

// made returns v, a value a constructor made, or panics with err: the
// bench names its keys and sets its options itself, so that a
// constructor's error is a bug of the bench.
func made[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// semaphoreLocker adapts a redisync Semaphore, one permit at a time.
type semaphoreLocker struct{ s *redisync.Semaphore }

// Lock acquires one permit.
func (l semaphoreLocker) Lock(ctx context.Context) error { return l.s.Acquire(ctx, 1) }

// Unlock releases one permit.
func (l semaphoreLocker) Unlock(ctx context.Context) error { return l.s.Release(ctx, 1) }

// redisyncLibrary is redisync with its default options (a fair Mutex:
// FIFO queue, hand-off inside the release script), or with Barging when
// barging is set.
func redisyncLibrary(barging bool) library {
	lib := library{
		name:  "redisync",
		about: "redisync defaults: fair, hand-off in the release script, pub/sub wake-up, crash timeout 15 s",
		open: func(addr string, counts *clientCounts) (instance, error) {
			return newRedisyncInstance(newGoRedis(addr, counts), counts, barging)
		},
		openCluster: func(addrs []string, counts *clientCounts) (instance, error) {
			return newRedisyncInstance(newGoRedisCluster(addrs, counts), counts, barging)
		},
		redisKey:   func(name string) string { return schema.LockKeys(schema.DefaultPrefix, name).Hash },
		semaphores: !barging && redisyncSemaphore != nil,
		rwmutexes:  !barging, // Barging is no option of a RWMutex
	}
	if barging {
		lib.name = "redisync-barging"
		lib.about = "redisync with Barging(): Redisson's unfair mode, the release wakes waiters to race for the lock"
	}
	return lib
}

// newRedisyncInstance returns a redisync Client on rdb, whose own
// connections count their requests in counts too.
func newRedisyncInstance(rdb redis.UniversalClient, counts *clientCounts, barging bool) (instance, error) {
	opts := []redisync.Option{redisync.WithConnSetup(func(c *redis.Client) error {
		c.AddHook(goRedisCounter{counts})
		return nil
	})}
	if barging {
		opts = append(opts, redisync.Barging())
	}
	c, err := redisync.New(rdb, opts...)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return &redisyncInstance{rdb: rdb, c: c}, nil
}

// redisyncInstance is one redisync Client on its own go-redis client (a
// *redis.Client, or a *redis.ClusterClient in the cluster scenario).
type redisyncInstance struct {
	rdb redis.UniversalClient
	c   *redisync.Client
}

// Mutex returns a new redisync Mutex value: one owner.
func (r *redisyncInstance) Mutex(key string) locker { return made(r.c.NewMutex(key)) }

// Semaphore returns a holder of one permit through the redisyncSemaphore
// hook; the plan calls it only when the hook is set.
func (r *redisyncInstance) Semaphore(key string, size int64) locker {
	return redisyncSemaphore(r.c, key, size)
}

// Close closes the redisync Client, then its go-redis client.
func (r *redisyncInstance) Close() error {
	return errors.Join(r.c.Close(), r.rdb.Close())
}
