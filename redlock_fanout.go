package redisync

import (
	"context"
	"slices"
	"sync"
	"time"
)

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
