package main

import (
	"errors"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// redisyncLibrary is redisync with its default options, or its fair
// (FIFO, direct hand-off) Mutex when fair is set.
func redisyncLibrary(fair bool) library {
	lib := library{
		name:  "redisync",
		about: "redisync defaults: pub/sub wake-up, watchdog lease 30 s",
		open: func(addr string, counts *clientCounts) (instance, error) {
			rdb := newGoRedis(addr, counts)
			return &redisyncInstance{rdb: rdb, c: redisync.New(rdb), fair: fair}, nil
		},
	}
	if fair {
		lib.name = "redisync-fair"
		lib.about = "redisync with Fair(): FIFO queue, hand-off inside the release script"
	}
	return lib
}

// redisyncInstance is one redisync Client on its own go-redis client.
type redisyncInstance struct {
	rdb  *redis.Client
	c    *redisync.Client
	fair bool
}

// Mutex returns a new redisync Mutex value: one owner.
func (r *redisyncInstance) Mutex(key string) locker {
	if r.fair {
		return r.c.NewMutex(key, redisync.Fair())
	}
	return r.c.NewMutex(key)
}

// Close closes the redisync Client, then its go-redis client.
func (r *redisyncInstance) Close() error {
	return errors.Join(r.c.Close(), r.rdb.Close())
}
