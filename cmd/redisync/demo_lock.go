package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/fairness"
)

// lockPart is the demo of the fair lock: every worker has its own Mutex
// and loops on Lock, hold, Unlock, pause.
type lockPart struct {
	inside     atomic.Int32 // workers between Lock and Unlock
	violations atomic.Int64 // times a worker found another one inside

	mu        sync.Mutex
	lastToken int64
	tokenBad  int64             // tokens not above the previous one
	acq       [][]int64         // [client][worker] acquisitions
	maxWait   [][]time.Duration // [client][worker] longest Lock
	errs      []error
}

func newLockPart() demoPart { return &lockPart{} }

func (p *lockPart) title(env *demoEnv) string { return fmt.Sprintf("the fair lock %q", env.name) }

func (p *lockPart) primitive() redisync.Primitive { return redisync.PrimitiveMutex }

func (p *lockPart) start(ctx context.Context, env *demoEnv, wg *sync.WaitGroup) {
	p.acq = make([][]int64, len(env.clients))
	p.maxWait = make([][]time.Duration, len(env.clients))
	for ci, c := range env.clients {
		p.acq[ci] = make([]int64, env.workers)
		p.maxWait[ci] = make([]time.Duration, env.workers)
		for wi := range env.workers {
			m, err := c.NewMutex(env.name)
			if err != nil {
				p.fail(err)
				return
			}
			wg.Go(func() { p.work(ctx, env, m, ci, wi) })
		}
	}
}

// work is one worker: it takes the lock until ctx ends.
func (p *lockPart) work(ctx context.Context, env *demoEnv, m *redisync.Mutex, ci, wi int) {
	owner := ""
	for ctx.Err() == nil {
		t0 := time.Now()
		if err := m.Lock(ctx); err != nil {
			if !ended(ctx, err) {
				p.fail(fmt.Errorf("c%d.w%d: Lock: %w", ci+1, wi+1, err))
			}
			return
		}
		waited := time.Since(t0)
		if p.inside.Add(1) != 1 {
			p.violations.Add(1)
		}
		if owner == "" {
			owner = p.learnOwner(env, ci, wi)
		}
		p.record(m.Token(), ci, wi, waited)
		pause(nil, randUpTo(env.hold)) // the work under the lock always ends
		p.inside.Add(-1)

		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := m.Unlock(uctx)
		cancel()
		if err != nil {
			p.fail(fmt.Errorf("c%d.w%d: Unlock: %w", ci+1, wi+1, err))
			return
		}
		pause(ctx.Done(), randUpTo(env.hold/2))
	}
}

// learnOwner finds the owner id of the worker, which holds the lock now,
// for the labels of the view.
func (p *lockPart) learnOwner(env *demoEnv, ci, wi int) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := readStatus(ctx, env.rdb, env.prefix, env.name, false)
	if err != nil || st.Lock.Holder == nil {
		return ""
	}
	env.labels.learn(st.Lock.Holder.Owner, ci+1, wi+1)
	return st.Lock.Holder.Owner
}

// record counts an acquisition with token, after waiting for waited.
func (p *lockPart) record(token int64, ci, wi int, waited time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if token <= p.lastToken {
		p.tokenBad++
	}
	p.lastToken = max(p.lastToken, token)
	p.acq[ci][wi]++
	p.maxWait[ci][wi] = max(p.maxWait[ci][wi], waited)
}

func (p *lockPart) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// total returns the acquisitions so far.
func (p *lockPart) total() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, ws := range p.acq {
		for _, a := range ws {
			n += a
		}
	}
	return n
}

func (p *lockPart) view(st *Status, lab *labeler) []string {
	l := st.Lock
	lines := []string{fmt.Sprintf("  fair lock %q   %d acquisitions", st.Name, p.total())}
	if h := l.Holder; h != nil {
		lines = append(lines, fmt.Sprintf("    held by   %-8s token %-6d lease %s", lab.name(h.Owner), h.Token, leaseText(h.LeaseMS)))
	} else {
		lines = append(lines, "    held by   nobody (free)")
	}
	// As many rows as can wait (up to maxQueueRows), so that the frame
	// keeps its height.
	const maxQueueRows = 10
	rows := min(len(p.acq)*len(p.acq[0])-1, maxQueueRows)
	for i := range max(rows, 1) {
		head := "              "
		if i == 0 {
			head = "    queue     "
		}
		switch {
		case i == 0 && len(l.Queue) == 0:
			lines = append(lines, head+"empty")
		case i >= len(l.Queue):
			lines = append(lines, "")
		case i == rows-1 && len(l.Queue) > rows:
			lines = append(lines, fmt.Sprintf("%s    ... and %d more", head, len(l.Queue)-i))
		default:
			w := l.Queue[i]
			lines = append(lines, fmt.Sprintf("%s%2d. %-8s heartbeat %s", head, w.Position, lab.name(w.Owner), heartbeatText(w)))
		}
	}
	return append(lines, "    per client "+p.bars())
}

// bars draws the acquisitions per client.
func (p *lockPart) bars() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	sums := make([]int64, len(p.acq))
	for ci, ws := range p.acq {
		for _, a := range ws {
			sums[ci] += a
		}
	}
	top := max(maxOf(sums), 1)
	var b strings.Builder
	for ci, n := range sums {
		fmt.Fprintf(&b, " c%d %-6s%3d ", ci+1, strings.Repeat("|", int(6*n/top)), n)
	}
	return b.String()
}

func (p *lockPart) brief(st *Status, lab *labeler) string {
	holder := "free"
	if h := st.Lock.Holder; h != nil {
		holder = fmt.Sprintf("%s (token %d)", lab.name(h.Owner), h.Token)
	}
	queue := make([]string, len(st.Lock.Queue))
	for i, w := range st.Lock.Queue {
		queue[i] = lab.name(w.Owner)
	}
	return fmt.Sprintf("lock %q: holder %s, queue [%s], %d acquisitions", st.Name, holder, strings.Join(queue, " "), p.total())
}

func (p *lockPart) summary(w io.Writer, elapsed time.Duration, st *Status) []check {
	p.mu.Lock()
	defer p.mu.Unlock()
	var total int64
	var perWorker []int64
	var worst time.Duration
	starved := 0
	fmt.Fprintf(w, "\nfair lock %q\n  client  acquisitions  max wait\n", st.Name)
	for ci := range p.acq {
		var n int64
		for _, a := range p.acq[ci] {
			n += a
			perWorker = append(perWorker, a)
			if a == 0 {
				starved++
			}
		}
		total += n
		mw := maxOf(p.maxWait[ci])
		worst = max(worst, mw)
		fmt.Fprintf(w, "  c%-6d %12d  %8v\n", ci+1, n, mw.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  total   %12d  %8v   (%.0f/s; fairness, Jain's index over %d workers: %.3f, 1 is even)\n",
		total, worst.Round(time.Millisecond), rate(total, elapsed), len(perWorker), fairness.Jain(perWorker))

	left := "nothing left in Redis: the lock is free and its queue empty"
	if st.Lock.Holder != nil || len(st.Lock.Queue) > 0 {
		left = fmt.Sprintf("left in Redis after every client closed: holder %v, %d queued", st.Lock.Holder != nil, len(st.Lock.Queue))
	}
	errText := "no errors from Redis or the library"
	if len(p.errs) > 0 {
		errText = fmt.Sprintf("%d errors, first: %v", len(p.errs), p.errs[0])
	}
	return []check{
		{p.violations.Load() == 0, fmt.Sprintf("lock: mutual exclusion, %d times two workers held it at once", p.violations.Load())},
		{p.tokenBad == 0, fmt.Sprintf("lock: fencing tokens grew with every hold (%d out of order)", p.tokenBad)},
		{starved == 0 && total > 0, fmt.Sprintf("lock: every worker got the lock (%d of %d never did)", starved, len(perWorker))},
		{len(p.errs) == 0, "lock: " + errText},
		{st.Lock.Holder == nil && len(st.Lock.Queue) == 0, "lock: " + left},
	}
}

// randUpTo returns a random duration in [d/10, d].
func randUpTo(d time.Duration) time.Duration {
	return d/10 + rand.N(d-d/10+1)
}

// pause waits for d, or until done is closed.
func pause(done <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-done:
	}
}
