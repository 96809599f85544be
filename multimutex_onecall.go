package redisync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
)

// takeAll makes one attempt to take every lock of m in one script call
// (multi_acquire.lua: their keys share a slot), which succeeds when each
// is free and nobody queues for it. It reports whether m holds them all
// now; when it does not, it leaves nothing behind.
func (m *MultiMutex) takeAll(ctx context.Context, locks []*Mutex) (bool, error) {
	first := locks[0]
	ticket := m.c.ticket(first.cfg.label)
	acquire := multiAcquireArgs{ticket: ticket, lease: first.cfg.holdLease(), metadata: first.cfg.metadata}.call(m.keys)
	sent := time.Now()
	res, abandoned, err := m.c.rt.Attempt(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return m.c.runAcked(ctx, rdb, first.cfg, acquire, granted)
	}, func([]int64, error) {
		ctx, cancel := roundtrip.Detached(context.Background())
		defer cancel()
		m.withdraw(ctx, m.c.rdb, ticket, locks)
	})
	switch {
	case abandoned:
		return false, err
	case err != nil:
		if roundtrip.MayHaveRun(err) {
			m.cleanup(ctx, ticket, locks)
		}
		return false, redisError(err)
	case res[0] == 0:
		return false, nil
	case res[0] != 1 || len(res) != 1+len(locks):
		m.cleanup(ctx, ticket, locks) // not on a new ticket; but leave nothing
		return false, nil
	}
	for i, l := range locks {
		call := &lockCall{m: l, ticket: ticket, mode: "try", place: place{wd: m.c.wd}}
		if ok, _, err := call.take(ctx, res[1+i], sent, l.cfg.holdLease(), false); !ok {
			// take gave back this name (its lease may have run out
			// already, or the Client is closed): give back the rest.
			_ = m.giveBack(ctx, locks[:i])
			m.cleanup(ctx, ticket, locks[i+1:])
			return false, err
		}
	}
	return true, nil
}

// cleanup withdraws ticket from locks, as a Lock call that gives up does
// (lockCall.withdraw), waiting for it at most until roundtrip.GraceEnd(ctx).
func (m *MultiMutex) cleanup(ctx context.Context, ticket string, locks []*Mutex) {
	m.c.rt.Cleanup(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		m.withdraw(ctx, rdb, ticket, locks)
		return nil, nil
	})
}

// withdraw withdraws ticket from each of locks, releasing what it holds.
func (m *MultiMutex) withdraw(ctx context.Context, rdb redis.UniversalClient, ticket string, locks []*Mutex) {
	for _, l := range locks {
		_ = l.withdraw(ctx, rdb, withdrawal{ticket: ticket, refuse: true})
	}
}

// releaseAll releases the hold of each of locks, m's names: in one script call
// where they share a slot (multi_release.lua), else one call per name,
// all at once (giveBack). As Mutex.Unlock does, each name's hold is
// forgotten before the release is sent: no longer renewed, it runs out
// within its lease if the release fails. A script that fails on one
// name's keys (of the wrong type) is followed by a release of each name
// alone, so that the others are released all the same.
func (m *MultiMutex) releaseAll(ctx context.Context, locks []*Mutex) error {
	if !m.fast || m.c.usable() != nil {
		return m.giveBack(ctx, locks)
	}
	n := len(locks)
	args := multiReleaseArgs{ids: make([]string, n), tokens: make([]int64, n), publish: m.c.publish}
	told := make([]*hold, n) // the holds whose end is told once Redis answered
	var lost error
	for i, l := range locks {
		l.mu.Lock()
		if h := l.cur; h != nil {
			args.ids[i], args.tokens[i] = h.id, h.token
			if h.isLost { // told already; its release takes no tombstone
				args.tokens[i], lost = 0, ErrLockLost
			} else {
				told[i] = h
			}
			l.forgetUntoldLocked(h)
		}
		l.mu.Unlock()
	}
	release := args.call(m.keys)
	res, abandoned, err := m.c.rt.Settle(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return release.run(ctx, rdb).Int64Slice()
	}, nil)
	if err == nil && len(res) != n {
		err = fmt.Errorf("redisync: multi_release.lua replied %v", res)
	}
	if err != nil && !abandoned && !m.c.rt.Transient(err) {
		res, err = m.releaseEach(ctx, locks, args)
	}
	for i, h := range told {
		gone := err == nil && res[i] != 1 // as Mutex.Unlock: 2 is a hold that ended otherwise
		if h != nil {
			locks[i].told(h, gone)
		}
		if gone {
			lost = ErrLockLost
		}
	}
	if err != nil {
		return errors.Join(lost, notConfirmed(redisError(err)))
	}
	return lost
}

// releaseEach releases the holds args names, of locks, one call per name,
// in turn: the replies of release.lua, and the errors joined.
func (m *MultiMutex) releaseEach(ctx context.Context, locks []*Mutex, args multiReleaseArgs) ([]int64, error) {
	res, errs := make([]int64, len(locks)), make([]error, len(locks))
	for i, l := range locks {
		res[i], errs[i] = l.release(ctx, m.c.rdb, &hold{id: args.ids[i], token: args.tokens[i]})
	}
	return res, errors.Join(errs...)
}
