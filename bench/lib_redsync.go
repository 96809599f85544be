package main

import (
	"context"
	"errors"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// redsyncLibrary is go-redsync/redsync v4 with its default options (32
// tries, 50-250 ms apart, 8 s expiry) on one goredis v9 pool, as its
// README shows.
func redsyncLibrary() library {
	return library{
		name:  "redsync",
		about: "redsync v4 defaults (32 tries 50-250 ms apart), Lock retried until the run ends",
		open: func(addr string, counts *clientCounts) (instance, error) {
			rdb := newGoRedis(addr, counts)
			return &redsyncInstance{rdb: rdb, rs: redsync.New(goredis.NewPool(rdb))}, nil
		},
		openCluster: func(addrs []string, counts *clientCounts) (instance, error) {
			rdb := newGoRedisCluster(addrs, counts)
			return &redsyncInstance{rdb: rdb, rs: redsync.New(goredis.NewPool(rdb))}, nil
		},
		redisKey: func(name string) string { return name },
	}
}

// redsyncInstance is one Redsync on its own go-redis client (cluster or
// not: its goredis pool takes a redis.UniversalClient).
type redsyncInstance struct {
	rdb redis.UniversalClient
	rs  *redsync.Redsync
}

// Mutex returns a new redsync Mutex: it carries its holder's value, so it
// is one owner.
func (r *redsyncInstance) Mutex(key string) locker {
	return redsyncLocker{r.rs.NewMutex(key)}
}

// Close closes the go-redis client.
func (r *redsyncInstance) Close() error { return r.rdb.Close() }

// redsyncLocker adapts a redsync Mutex.
type redsyncLocker struct{ m *redsync.Mutex }

// Lock calls LockContext until it succeeds: redsync gives up after its
// tries, and its documentation says to call again. It returns ctx's error
// once ctx ends, and any error other than "taken" at once.
func (l redsyncLocker) Lock(ctx context.Context) error {
	for {
		err := l.m.LockContext(ctx)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !redsyncTaken(err):
			return err
		}
	}
}

// redsyncTaken reports whether err only says that the lock was held.
func redsyncTaken(err error) bool {
	var taken *redsync.ErrTaken
	var nodeTaken *redsync.ErrNodeTaken
	return errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.As(err, &nodeTaken)
}

// Unlock releases the lock; losing it before (expiry) is an error.
func (l redsyncLocker) Unlock(ctx context.Context) error {
	ok, err := l.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock found the lock gone")
	}
	return err
}
