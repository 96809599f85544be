package redisync

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/watchdog"
)

var (
	//go:embed scripts/redlock_raise.lua
	luaRedlockRaise string

	redlockRaiseScript = newScript("redlockRaise", luaLockLib, luaRedlockRaise)
)

// round makes one attempt on every node and keeps the lock if a quorum
// granted it in time (for a waiting Lock, its waiters are registered under
// x.addr; "" for a TryLock: see Mutex.tryOnce). It reports whether the
// lock is held for the call now (its hold is m's) and, when not, how long
// to sleep at most (0: attempt again at once) and whether the call had
// taken some nodes (a split). It
// returns an error wrapping ErrQuorum when fewer than a quorum answered.
func (x *redCall) round(ctx context.Context) (acquired bool, sleep time.Duration, split bool, err error) {
	m := x.m
	if err := cmp.Or(m.r.usable(), ctx.Err()); err != nil {
		return false, 0, false, err
	}
	start := time.Now()
	use := x.idle()
	res := x.fanOut(ctx, use, x.acquireOn, func(res []nodeResult) bool {
		// Known: won; lost for want of answers; or lost to
		// another owner, with a quorum answering.
		ok, busy, failed := 0, 0, 0
		for i, r := range res {
			switch {
			case !use[i] || (r.done && r.err != nil):
				failed++
			case r.done && r.ok:
				ok++
			case r.done:
				busy++
			}
		}
		n, q := len(x.nodes), m.r.quorum
		return ok >= q || failed > n-q || (ok+busy >= q && busy+failed > n-q)
	}, x.lateAcquire)
	var got []int
	failed := &NodeErrors{}
	answered, busy, pttl, token := 0, 0, int64(-1), int64(0)
	for i, r := range res {
		switch {
		case !use[i]:
			failed.Nodes = append(failed.Nodes, NodeError{Node: i, Err: errNodeBusy})
		case !r.done || r.err != nil:
			failed.Nodes = append(failed.Nodes, nodeError(i, r))
		case r.ok:
			answered++
			got = append(got, i)
			token = max(token, r.token)
		default:
			answered++
			busy++
			if r.pttl >= 0 && (pttl < 0 || r.pttl < pttl) {
				pttl = r.pttl
			}
		}
	}
	var late error
	if len(got) >= m.r.quorum {
		held := x.raise(ctx, got, token)
		elapsed := time.Since(start)
		if len(held) >= m.r.quorum && elapsed < m.lease-watchdog.Drift(m.lease) {
			x.releaseAll(ctx, without(got, held))
			err := m.commit(ctx, x, held, token, x.addr != "")
			switch {
			case err == nil:
				return true, 0, false, nil
			case errors.Is(err, errBusy):
				x.releaseAll(ctx, held)
				if x.addr == "" { // a TryLock
					return false, 0, false, nil
				}
				// m's last hold was lost and its Unlock is owed: wait
				// for it holding nothing, then make a new round.
				if err := owedUnlock(ctx, &m.mu, m.owed, m.r.clients[0].ctx.Done(), true); err != nil {
					return false, 0, false, err
				}
				x.h = &hold{n: 1, lost: make(chan struct{})}
				return false, 0, false, nil
			case !errors.Is(err, ErrLockLost):
				x.releaseAll(ctx, held)
				return false, 0, false, err
			}
			// Lost while it waited for m's lost hold to be released:
			// give it back, and go on with a hold of its own.
			x.releaseAll(ctx, held)
			x.h = &hold{n: 1, lost: make(chan struct{})}
			return false, 0, false, nil
		}
		if len(held) >= m.r.quorum {
			late = fmt.Errorf("%w: a quorum took %v, which leaves no validity of the lease %v",
				ErrQuorum, elapsed.Round(time.Millisecond), m.lease)
		}
	}
	x.releaseAll(ctx, got)
	switch {
	case ctx.Err() != nil:
		return false, 0, false, ctx.Err()
	case late != nil:
		return false, 0, false, late
	case answered < m.r.quorum:
		return false, 0, false, fmt.Errorf("%w: %d of %d nodes answered, %d needed: %w",
			ErrQuorum, answered, len(x.nodes), m.r.quorum, failed)
	}
	if len(got) > 0 && busy < m.r.quorum {
		// A split: no other owner can hold a quorum, so the lock may be
		// free in a moment: attempt again (after the split's pause).
		return false, 0, true, nil
	}
	// Another owner may hold a quorum (a bare one leaves a node free,
	// which every round takes and gives back): sleep until a release
	// wakes the call.
	return false, m.sleepFor(pttl), len(got) > 0, nil
}

// raise carries token to the counters of the nodes in got, and returns
// those that confirmed they still hold the lock.
func (x *redCall) raise(ctx context.Context, got []int, token int64) []int {
	res := x.fanOut(ctx, mask(len(x.nodes), got), func(ctx context.Context, i int) nodeResult {
		n := x.nodes[i]
		v, err := redlockRaiseArgs{id: n.holdID(), token: token}.call(n.keys).run(ctx, n.c.rdb).Int64()
		if err != nil {
			return nodeResult{err: redisError(err)}
		}
		return nodeResult{ok: v == 1}
	}, x.m.quorumOK, nil)
	var held []int
	for _, i := range got {
		if res[i].ok {
			held = append(held, i)
		}
	}
	return held
}

// acquireOn makes one attempt on node i.
func (x *redCall) acquireOn(ctx context.Context, i int) nodeResult {
	n := x.nodes[i]
	if err := n.c.ready(ctx, n.keys.GrantChannel(n.c.id)); err != nil {
		return nodeResult{err: err}
	}
	ok, pttl, err := n.tryOnce(ctx, "barge", x.addr)
	switch {
	case err != nil:
		return nodeResult{err: err}
	case !ok:
		return nodeResult{pttl: pttl}
	}
	return nodeResult{ok: true, token: x.nodes[i].Token()}
}

// lateAcquire undoes an attempt on node i that returned after its round
// gave up on it.
func (x *redCall) lateAcquire(i int, r nodeResult) {
	if r.ok {
		ctx, cancel := context.WithTimeout(context.Background(), roundtrip.CleanupTimeout)
		defer cancel()
		_ = x.nodes[i].unlock(ctx)
	}
}

// releaseOn releases node i's hold: ok when it was released, neither ok
// nor an error when it was not there any more.
func (x *redCall) releaseOn(ctx context.Context, i int) nodeResult {
	err := x.nodes[i].unlock(ctx)
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
func (x *redCall) releaseAll(ctx context.Context, idx []int) {
	if len(idx) > 0 {
		x.fanOut(context.WithoutCancel(ctx), mask(len(x.nodes), idx), x.releaseOn, x.m.quorumOK, nil)
	}
}

// idle returns the nodes a round may call: those with no call of x still
// running, and whose node Mutex holds nothing (a late grant not undone yet).
func (x *redCall) idle() []bool {
	use := make([]bool, len(x.nodes))
	x.mu.Lock()
	for i := range use {
		use[i] = x.busy[i] == 0
	}
	x.mu.Unlock()
	for i, n := range x.nodes {
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

// nodeResult is what one node's call of a round returned.
type nodeResult struct {
	done  bool // answered before the round gave up on it
	ok    bool // granted, raised or released
	token int64
	pttl  int64
	err   error
}

// fanOut runs call on every node i of x with use[i], all at once, each with ctx
// bounded by the node timeout. It returns when all have returned or the
// node timeout has passed, with the results of those that returned (done).
// When settled (if not nil) finds the outcome known before that, the others
// are given as long again as that took (at least minGrace) to return, so that a node that is
// down does not slow every call down to the node timeout, while healthy
// nodes, which answer alike, are all waited for. A call still running when
// fanOut returns goes on in the background (Close waits for it) and hands
// its result to late, if any, when it returns; until then its node is left
// out of x's rounds.
func (x *redCall) fanOut(ctx context.Context, use []bool, call func(context.Context, int) nodeResult,
	settled func([]nodeResult) bool, late func(int, nodeResult)) []nodeResult {
	m := x.m
	res := make([]nodeResult, len(x.nodes))
	var mu sync.Mutex // guards res, pending and abandoned
	pending, abandoned := 0, false
	done, early := make(chan struct{}), make(chan struct{})
	isEarly := false
	for i := range use {
		if use[i] {
			pending++
			x.setBusy(i, 1)
		}
	}
	if pending == 0 {
		return res
	}
	finish := func(i int, r nodeResult) {
		mu.Lock()
		if abandoned {
			mu.Unlock()
			if late != nil {
				late(i, r)
			}
			x.setBusy(i, -1)
			return
		}
		x.setBusy(i, -1)
		res[i] = r
		if pending--; pending == 0 {
			close(done)
		} else if !isEarly && settled != nil && settled(res) {
			isEarly = true
			close(early)
		}
		mu.Unlock()
	}
	for i := range use {
		if !use[i] {
			continue
		}
		started := m.r.goCall(func() {
			cctx, cancel := context.WithTimeout(ctx, m.nodeTimeout)
			r := call(cctx, i)
			cancel()
			r.done = true
			finish(i, r)
		})
		if !started {
			finish(i, nodeResult{done: true, err: ErrClosed})
		}
	}
	start := time.Now()
	t := time.NewTimer(m.nodeTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-early:
		grace := time.NewTimer(max(time.Since(start), minGrace))
		select {
		case <-done:
		case <-t.C:
		case <-grace.C:
		}
		grace.Stop()
	}
	mu.Lock()
	defer mu.Unlock()
	abandoned = true
	return slices.Clone(res)
}

// quorumOK reports whether a quorum of calls succeeded.
func (m *RedMutex) quorumOK(res []nodeResult) bool {
	n := 0
	for _, x := range res {
		if x.done && x.ok {
			n++
		}
	}
	return n >= m.r.quorum
}

// setBusy counts calls to node i still running.
func (x *redCall) setBusy(i, delta int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.busy[i] += delta
}

// mask returns a slice of n flags, set at idx.
func mask(n int, idx []int) []bool {
	use := make([]bool, n)
	for _, i := range idx {
		use[i] = true
	}
	return use
}
