package main

import (
	"context"
	"errors"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// rueidislockLibrary is rueidislock with its defaults but KeyMajority 1
// (one Redis instance, as its README says), woken by client-side caching
// invalidations. On a cluster, rueidis is given every primary as
// InitAddress and makes a cluster client; the lock is still one key.
func rueidislockLibrary() library {
	return library{
		name:  "rueidislock",
		about: "rueidislock defaults, KeyMajority 1: woken by client-side-caching invalidations",
		open: func(addr string, counts *clientCounts) (instance, error) {
			return openRueidislock([]string{addr}, counts)
		},
		openCluster: openRueidislock,
		// rueidislock's keyname(prefix, name, i), for its one key (i = 0).
		redisKey: func(name string) string { return "rueidislock:0:" + name },
	}
}

// openRueidislock opens a rueidislock Locker on the Redis (or the cluster)
// at addrs.
func openRueidislock(addrs []string, counts *clientCounts) (instance, error) {
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{InitAddress: addrs, DialCtxFn: rueidisDialer(counts)},
		KeyMajority:  1,
		ClientBuilder: func(opt rueidis.ClientOption) (rueidis.Client, error) {
			c, err := rueidis.NewClient(opt)
			if err != nil {
				return nil, err
			}
			return countingRueidis{Client: c, counts: counts}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return rueidislockInstance{l}, nil
}

// rueidislockInstance is one rueidislock Locker, which owns its rueidis
// client.
type rueidislockInstance struct{ l rueidislock.Locker }

// Mutex returns an owner of key: it keeps the cancel function that
// releases the lock it holds.
func (r rueidislockInstance) Mutex(key string) locker {
	return &rueidislockLocker{l: r.l, key: key}
}

// Close closes the Locker and its client.
func (r rueidislockInstance) Close() error {
	r.l.Close()
	return nil
}

// rueidislockLocker adapts rueidislock's WithContext to Lock/Unlock.
type rueidislockLocker struct {
	l       rueidislock.Locker
	key     string
	release context.CancelFunc
}

// Lock waits in WithContext, rueidislock's blocking acquire. The lock
// lives as long as ctx: if ctx ends while it is held, rueidislock releases
// it by itself.
func (l *rueidislockLocker) Lock(ctx context.Context) error {
	_, cancel, err := l.l.WithContext(ctx, l.key)
	if err != nil {
		return err
	}
	l.release = cancel
	return nil
}

// Unlock releases the lock and waits until its key is deleted.
func (l *rueidislockLocker) Unlock(context.Context) error {
	release := l.release
	l.release = nil
	if release == nil {
		return errors.New("rueidislock: unlock of a lock not held")
	}
	release()
	return nil
}
