package main

import (
	"errors"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/layout2"
)

// layout2Library is redisync's fair Mutex as it stood in layout 2 (lock
// hash, token key, queue zset, waiters hash, tombstones, bargers zset),
// frozen in internal/layout2 so that a run can set it beside the current
// layout. It has no semaphore, no read-write lock and no cluster client:
// it sits out those scenarios.
func layout2Library() library {
	return library{
		name: "redisync-layout2",
		about: "redisync's fair Mutex in layout 2 (internal/layout2, the scripts of a868dfa) with the same defaults; " +
			"no lease renewal (holds are short)",
		open: func(addr string, counts *clientCounts) (instance, error) {
			rdb := newGoRedis(addr, counts)
			return &layout2Instance{rdb: rdb, c: layout2.NewClient(rdb, layout2.DefaultPrefix)}, nil
		},
		redisKey: func(name string) string { return layout2.LockKey(layout2.DefaultPrefix, name) },
	}
}

// layout2Instance is one layout-2 Client on its own go-redis client.
type layout2Instance struct {
	rdb *redis.Client
	c   *layout2.Client
}

// Mutex returns a new layout-2 Mutex: one owner.
func (r *layout2Instance) Mutex(key string) locker { return r.c.NewMutex(key) }

// Close closes the layout-2 Client, then its go-redis client.
func (r *layout2Instance) Close() error {
	return errors.Join(r.c.Close(), r.rdb.Close())
}
