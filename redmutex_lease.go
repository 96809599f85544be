package redisync

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redisync/redisync/internal/watchdog"
)

// Extend makes m's hold last at least lease from now on a quorum of its
// nodes: on every node of the hold at once, each for at most the node
// timeout, it does what Mutex.Extend does (the node's lease in Redis set
// to lease unless more is left, never shortened; the node's local
// deadline counted from when its call was sent). Extend succeeds when a
// quorum of nodes extended their hold before lease, less the time the
// call took and a drift margin (1% + 2 ms), ran out, as a Lock round wins.
//
// Extend returns an error wrapping ErrInvalidOption, before any call to
// Redis, when lease is outside [1ms, MaxLease]; ErrNotHeld when m holds
// nothing, and ErrLockLost when its hold was lost, before any call to
// Redis too; ErrLockLost when fewer than a quorum of node holds are left
// (Lost is closed then); and an error wrapping ErrQuorum when fewer than a
// quorum of nodes extended in time: those that did keep their longer
// lease, which only ever grows. It returns ErrClosed after Close. It is
// safe for concurrent use.
func (m *RedMutex) Extend(ctx context.Context, lease time.Duration) error {
	return observed(m.r.observer(), ctx, CallInfo{Op: OpExtend, Primitive: PrimitiveRedMutex, Name: m.name}, func(ctx context.Context) error { return m.extend(ctx, lease) }, nil)
}

// extend is Extend, unobserved.
func (m *RedMutex) extend(ctx context.Context, lease time.Duration) error {
	if err := cmp.Or(m.r.usable(), ctx.Err()); err != nil {
		return m.wrap("extend", err)
	}
	if lease < minDuration || lease > MaxLease {
		return m.wrap("extend", fmt.Errorf("%w: lease %v is outside [%v, %v]", ErrInvalidOption, lease, minDuration, MaxLease))
	}
	h, err := m.held()
	if err != nil {
		return m.wrap("extend", err)
	}
	start := time.Now()
	res := m.onNodes(ctx, h, func(ctx context.Context, n *Mutex) nodeResult {
		err := n.extend(ctx, lease)
		return nodeResult{ok: err == nil, err: err}
	})
	elapsed := time.Since(start)
	ok, failed := m.tally(h, res)
	switch {
	case ok >= m.r.quorum && elapsed < lease-watchdog.Drift(lease):
		return nil
	case m.lost(h):
		return m.wrap("extend", ErrLockLost)
	case ok >= m.r.quorum:
		return m.wrap("extend", fmt.Errorf("%w: a quorum took %v, which leaves no validity of the lease %v",
			ErrQuorum, elapsed.Round(time.Millisecond), lease))
	}
	return m.wrap("extend", fmt.Errorf("%w: %d of %d nodes extended, %d needed: %w",
		ErrQuorum, ok, len(h.parts), m.r.quorum, failed))
}

// TTL returns what is left of m's hold's lease on a quorum of its nodes:
// each node of the hold is asked its lease left (as Mutex.TTL does), all
// at once, and TTL returns the quorum-th largest of the answers, less the
// time the call took and a drift margin (1% + 2 ms), as Lock counts a
// round's validity; 0 when that leaves nothing. To stop work in time,
// watch Lost.
//
// TTL returns 0 and an error wrapping ErrNotHeld when m holds nothing, and
// ErrLockLost when its hold was lost, without a call to Redis; ErrLockLost
// when fewer than a quorum of node holds are left (Lost is closed then);
// an error wrapping ErrQuorum when fewer than a quorum of nodes answered;
// and ErrClosed after Close. It is safe for concurrent use.
func (m *RedMutex) TTL(ctx context.Context) (time.Duration, error) {
	var ttl time.Duration
	err := observed(m.r.observer(), ctx, CallInfo{Op: OpTTL, Primitive: PrimitiveRedMutex, Name: m.name}, func(ctx context.Context) (err error) {
		ttl, err = m.ttl(ctx)
		return err
	}, nil)
	return ttl, err
}

// ttl is TTL, unobserved.
func (m *RedMutex) ttl(ctx context.Context) (time.Duration, error) {
	if err := cmp.Or(m.r.usable(), ctx.Err()); err != nil {
		return 0, m.wrap("ttl", err)
	}
	h, err := m.held()
	if err != nil {
		return 0, m.wrap("ttl", err)
	}
	start := time.Now()
	res := m.onNodes(ctx, h, func(ctx context.Context, n *Mutex) nodeResult {
		ttl, err := n.ttl(ctx)
		return nodeResult{ok: err == nil, pttl: ttl.Milliseconds(), err: err}
	})
	elapsed := time.Since(start)
	ok, failed := m.tally(h, res)
	switch {
	case ok >= m.r.quorum:
	case m.lost(h):
		return 0, m.wrap("ttl", ErrLockLost)
	default:
		return 0, m.wrap("ttl", fmt.Errorf("%w: %d of %d nodes answered, %d needed: %w",
			ErrQuorum, ok, len(h.parts), m.r.quorum, failed))
	}
	var left []time.Duration
	for _, r := range res {
		if r.done && r.ok {
			left = append(left, time.Duration(r.pttl)*time.Millisecond)
		}
	}
	slices.SortFunc(left, func(a, b time.Duration) int { return cmp.Compare(b, a) })
	kth := left[m.r.quorum-1]
	return max(kth-elapsed-watchdog.Drift(kth), 0), nil
}

// held returns m's hold, or why there is none to act on: ErrNotHeld, or
// ErrLockLost when it was lost.
func (m *RedMutex) held() (*hold, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.cur == nil:
		return nil, ErrNotHeld
	case m.cur.isLost:
		return nil, ErrLockLost
	}
	return m.cur, nil
}

// lost reports whether h, a hold of m, was lost.
func (m *RedMutex) lost(h *hold) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return h.isLost
}

// onNodes runs call with the Mutex of each node of h, all at once, each
// for at most the node timeout, and returns their results by node (done
// for those that returned in time).
func (m *RedMutex) onNodes(ctx context.Context, h *hold, call func(context.Context, *Mutex) nodeResult) []nodeResult {
	x := &redCall{m: m, nodes: h.parts, busy: make([]int, len(h.parts))}
	members := make([]bool, len(h.parts))
	for i, n := range h.parts {
		members[i] = n != nil
	}
	return x.fanOut(ctx, members, func(ctx context.Context, i int) nodeResult { return call(ctx, x.nodes[i]) }, m.quorumOK, nil)
}

// tally counts the nodes of h whose call succeeded, and collects the
// errors of the others.
func (m *RedMutex) tally(h *hold, res []nodeResult) (int, *NodeErrors) {
	ok, failed := 0, &NodeErrors{}
	for i, r := range res {
		switch {
		case h.parts[i] == nil:
		case r.done && r.ok:
			ok++
		default:
			failed.Nodes = append(failed.Nodes, nodeError(i, r))
		}
	}
	return ok, failed
}
