package redisync

import (
	"context"
	"time"
)

// takeAll makes one attempt to take every lock of m in one script call
// (multi_acquire.lua: their keys share a slot), which succeeds when each
// is free and nobody queues for it. It reports whether m holds them all
// now; when it does not, it leaves nothing behind.
func (m *MultiMutex) takeAll(ctx context.Context) (bool, error) {
	first := m.locks[0]
	ticket := m.c.ticket(first.cfg.label)
	acquire := multiAcquireArgs{ticket: ticket, lease: first.cfg.holdLease(), metadata: first.cfg.metadata}.call(m.keys)
	sent := time.Now()
	res, abandoned, err := m.c.call(ctx, func(ctx context.Context) ([]int64, error) {
		return m.c.runAcked(ctx, first.cfg, acquire, granted)
	}, func([]int64, error) {
		ctx, cancel := detached(context.Background())
		defer cancel()
		m.withdraw(ctx, ticket, m.locks)
	})
	switch {
	case abandoned:
		return false, err
	case err != nil:
		if mayHaveRun(err) {
			m.cleanup(ctx, ticket, m.locks)
		}
		return false, redisError(err)
	case res[0] == 0:
		return false, nil
	case res[0] != 1 || len(res) != 1+len(m.locks):
		m.cleanup(ctx, ticket, m.locks) // not on a new ticket; but leave nothing
		return false, nil
	}
	for i, l := range m.locks {
		call := &lockCall{m: l, ticket: ticket, mode: "try", place: place{wd: m.c.wd}}
		if ok, _, err := call.take(ctx, res[1+i], sent, l.cfg.holdLease(), false); !ok {
			// take gave back this name (its lease may have run out
			// already, or the Client is closed): give back the rest.
			_ = m.giveBack(ctx, m.locks[:i])
			m.cleanup(ctx, ticket, m.locks[i+1:])
			return false, err
		}
	}
	m.commit(ctx)
	return true, nil
}

// cleanup withdraws ticket from locks, as a Lock call that gives up does
// (lockCall.withdraw), waiting for it at most until graceEnd(ctx).
func (m *MultiMutex) cleanup(ctx context.Context, ticket string, locks []*Mutex) {
	m.c.cleanup(ctx, func(ctx context.Context) ([]int64, error) {
		m.withdraw(ctx, ticket, locks)
		return nil, nil
	})
}

// withdraw withdraws ticket from each of locks, releasing what it holds.
func (m *MultiMutex) withdraw(ctx context.Context, ticket string, locks []*Mutex) {
	for _, l := range locks {
		_, _ = l.release(ctx, ticket, 0, "withdraw")
	}
}
