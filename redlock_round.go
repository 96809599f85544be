package redisync

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/redlock_raise.lua
	luaRedlockRaise string

	redlockRaiseScript = redis.NewScript(luaLib + luaRedlockRaise)
)

// round makes one attempt on every node and keeps the lock if a quorum
// granted it in time; waiter is the address of the waiting Lock call that
// makes it, "" for a TryLock (see Mutex.tryOnce). It reports whether m
// holds the lock now and, when not, how long to sleep at most and whether
// m had taken some nodes (a split). It returns an error wrapping ErrQuorum
// when fewer than a quorum answered.
func (m *RedMutex) round(ctx context.Context, waiter string) (acquired bool, sleep time.Duration, split bool, err error) {
	if err := m.begin(ctx); err != nil {
		return false, 0, false, err
	}
	defer m.end()
	m.mu.Lock()
	if m.cur != nil && !m.cur.isLost {
		m.cur.n++
		h := m.cur
		m.mu.Unlock()
		noteHold(ctx, h)
		return true, 0, false, nil
	}
	var stale []int
	if m.cur != nil {
		// The hold was lost: drop it (its Lost channel stays closed)
		// and take the lock anew once its node holds left are released.
		for i, in := range m.member {
			if in {
				stale = append(stale, i)
			}
		}
		m.forget()
	}
	m.mu.Unlock()
	m.releaseAll(ctx, stale)

	start := time.Now()
	use := m.idle()
	acquireOn := func(ctx context.Context, i int) nodeResult { return m.acquireOn(ctx, i, waiter) }
	res := m.fanOut(ctx, use, acquireOn, func(res []nodeResult) bool {
		// Known: won; lost for want of answers; or lost to
		// another owner, with a quorum answering.
		ok, busy, failed := 0, 0, 0
		for i, x := range res {
			switch {
			case !use[i] || (x.done && x.err != nil):
				failed++
			case x.done && x.ok:
				ok++
			case x.done:
				busy++
			}
		}
		n, q := len(m.nodes), m.r.quorum
		return ok >= q || failed > n-q || (ok+busy >= q && busy+failed > n-q)
	}, m.lateAcquire)
	var got []int
	failed := &NodeErrors{}
	answered, pttl, token := 0, int64(-1), int64(0)
	for i, x := range res {
		switch {
		case !use[i]:
			failed.Nodes = append(failed.Nodes, NodeError{Node: i, Err: errNodeBusy})
		case !x.done || x.err != nil:
			failed.Nodes = append(failed.Nodes, nodeError(i, x))
		case x.ok:
			answered++
			got = append(got, i)
			token = max(token, x.token)
		default:
			answered++
			if x.pttl >= 0 && (pttl < 0 || x.pttl < pttl) {
				pttl = x.pttl
			}
		}
	}
	var late error
	if len(got) >= m.r.quorum {
		held := m.raise(ctx, got, token)
		elapsed := time.Since(start)
		if len(held) >= m.r.quorum && elapsed < m.lease-drift(m.lease) {
			noteHold(ctx, m.commit(held, token))
			m.releaseAll(ctx, without(got, held))
			return true, 0, false, nil
		}
		if len(held) >= m.r.quorum {
			late = fmt.Errorf("%w: a quorum took %v, which leaves no validity of the lease %v",
				ErrQuorum, elapsed.Round(time.Millisecond), m.lease)
		}
	}
	m.releaseAll(ctx, got)
	switch {
	case ctx.Err() != nil:
		return false, 0, false, ctx.Err()
	case late != nil:
		return false, 0, false, late
	case answered < m.r.quorum:
		return false, 0, false, fmt.Errorf("%w: %d of %d nodes answered, %d needed: %w",
			ErrQuorum, answered, len(m.nodes), m.r.quorum, failed)
	}
	return false, m.sleepFor(pttl), len(got) > 0, nil
}

// raise carries token to the counters of the nodes in got, and returns
// those that confirmed they still hold the lock.
func (m *RedMutex) raise(ctx context.Context, got []int, token int64) []int {
	res := m.fanOut(ctx, mask(len(m.nodes), got), func(ctx context.Context, i int) nodeResult {
		n := m.nodes[i]
		v, err := redlockRaiseArgs{id: n.holdID(), token: token}.call(n.keys).run(ctx, n.c.rdb).Int64()
		if err != nil {
			return nodeResult{err: redisError(err)}
		}
		return nodeResult{ok: v == 1}
	}, m.quorumOK, nil)
	var held []int
	for _, i := range got {
		if res[i].ok {
			held = append(held, i)
		}
	}
	return held
}

// acquireOn makes one attempt on node i (waiter: as for round).
func (m *RedMutex) acquireOn(ctx context.Context, i int, waiter string) nodeResult {
	n := m.nodes[i]
	if err := n.c.ready(ctx, n.keys.GrantChannel(n.c.id)); err != nil {
		return nodeResult{err: err}
	}
	ok, pttl, err := n.tryOnce(ctx, "barge", waiter)
	switch {
	case err != nil:
		return nodeResult{err: err}
	case !ok:
		return nodeResult{pttl: pttl}
	}
	return nodeResult{ok: true, token: m.nodes[i].Token()}
}

// lateAcquire undoes an attempt on node i that returned after its round
// gave up on it.
func (m *RedMutex) lateAcquire(i int, x nodeResult) {
	if x.ok {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = m.nodes[i].unlock(ctx)
	}
}

// releaseOn releases node i's hold: ok when it was released, neither ok
// nor an error when it was not there any more.
func (m *RedMutex) releaseOn(ctx context.Context, i int) nodeResult {
	err := m.nodes[i].unlock(ctx)
	switch {
	case err == nil:
		return nodeResult{ok: true}
	case errors.Is(err, ErrLockLost), errors.Is(err, ErrNotHeld):
		return nodeResult{}
	}
	return nodeResult{err: err}
}

// releaseAll releases the node holds of the nodes in idx, which are not
// part of a hold of m. It outlives ctx.
func (m *RedMutex) releaseAll(ctx context.Context, idx []int) {
	if len(idx) > 0 {
		m.fanOut(context.WithoutCancel(ctx), mask(len(m.nodes), idx), m.releaseOn, m.quorumOK, nil)
	}
}

// idle returns the nodes a round may call: those with no call of m still
// running, and whose node Mutex holds nothing (a late grant not undone yet).
func (m *RedMutex) idle() []bool {
	use := make([]bool, len(m.nodes))
	m.mu.Lock()
	for i := range use {
		use[i] = m.busy[i] == 0
	}
	m.mu.Unlock()
	for i, n := range m.nodes { // their mu is taken before m.mu, never after
		use[i] = use[i] && n.current() == nil
	}
	return use
}

// sleepFor is how long a waiter sleeps at most after a round that found
// the lock held with the given shortest PTTL (-1: none known).
func (m *RedMutex) sleepFor(pttl int64) time.Duration {
	if pttl < 0 {
		return m.recheck
	}
	return min(max(time.Duration(pttl)*time.Millisecond, time.Millisecond), m.recheck)
}

// nodeError is why node i's call, which returned x, failed.
func nodeError(i int, x nodeResult) NodeError {
	if !x.done {
		return NodeError{Node: i, Err: errNoReply}
	}
	return NodeError{Node: i, Err: x.err}
}

// without returns the elements of a not in b.
func without(a, b []int) []int {
	var out []int
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
