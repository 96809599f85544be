// The semaphore part of the demo.

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
)

// demoSemSize is the size of the demo's semaphore; workers take 1 or 2
// permits at a time.
const demoSemSize = 3

// semPart is the demo of the semaphore: every worker has its own
// Semaphore value and loops on Acquire, hold, Release, pause.
type semPart struct {
	inUse      atomic.Int64 // permits between Acquire and Release
	maxInUse   atomic.Int64
	violations atomic.Int64 // times more than demoSemSize were in use

	mu      sync.Mutex
	acq     []int64 // per client
	maxWait time.Duration
	errs    []error
}

func newSemPart() demoPart { return &semPart{} }

func (p *semPart) title(env *demoEnv) string {
	return fmt.Sprintf("the semaphore %q (%d permits, 1 or 2 at a time)", env.name, demoSemSize)
}

func (p *semPart) primitive() redisync.Primitive { return redisync.PrimitiveSemaphore }

func (p *semPart) start(ctx context.Context, env *demoEnv, wg *sync.WaitGroup) {
	p.acq = make([]int64, len(env.clients))
	for ci, c := range env.clients {
		for range env.workers {
			s, err := c.NewSemaphore(env.name, demoSemSize)
			if err != nil {
				p.fail(err)
				return
			}
			wg.Go(func() { p.work(ctx, env, s, ci) })
		}
	}
}

// work is one worker: it takes permits until ctx ends.
func (p *semPart) work(ctx context.Context, env *demoEnv, s *redisync.Semaphore, ci int) {
	for ctx.Err() == nil {
		n := 1 + rand.Int64N(2)
		t0 := time.Now()
		if err := s.Acquire(ctx, n); err != nil {
			if !ended(ctx, err) {
				p.fail(fmt.Errorf("c%d: Acquire(%d): %w", ci+1, n, err))
			}
			return
		}
		waited := time.Since(t0)
		used := p.inUse.Add(n)
		if used > demoSemSize {
			p.violations.Add(1)
		}
		for old := p.maxInUse.Load(); used > old && !p.maxInUse.CompareAndSwap(old, used); old = p.maxInUse.Load() {
		}
		p.record(ci, waited)
		pause(nil, randUpTo(env.hold))
		p.inUse.Add(-n)

		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.Release(rctx, n)
		cancel()
		if err != nil {
			p.fail(fmt.Errorf("c%d: Release(%d): %w", ci+1, n, err))
			return
		}
		pause(ctx.Done(), randUpTo(env.hold/2))
	}
}

func (p *semPart) record(ci int, waited time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acq[ci]++
	p.maxWait = max(p.maxWait, waited)
}

func (p *semPart) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

func (p *semPart) total() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, a := range p.acq {
		n += a
	}
	return n
}

func (p *semPart) view(st *Status, lab *labeler) []string {
	lines := []string{fmt.Sprintf("  semaphore %q   %d acquisitions", st.Name, p.total())}
	s := st.Semaphore
	if s == nil {
		return append(lines, "    not created yet", "    queue     empty")
	}
	held := make([]string, len(s.Holders))
	for i, h := range s.Holders {
		held[i] = fmt.Sprintf("%s x%d", lab.name(h.Owner), h.Permits)
	}
	lines = append(lines, fmt.Sprintf("    permits   %s%s  %d of %d free   held by %s",
		strings.Repeat("#", int(s.Size-s.Available)), strings.Repeat(".", int(s.Available)), s.Available, s.Size, strings.Join(held, ", ")))
	queue := make([]string, len(s.Queue))
	for i, w := range s.Queue {
		queue[i] = fmt.Sprintf("%d. %s x%d", w.Position, lab.name(w.Owner), w.Permits)
	}
	if len(queue) == 0 {
		queue = []string{"empty"}
	}
	return append(lines, "    queue     "+strings.Join(queue, "  "))
}

func (p *semPart) brief(st *Status, lab *labeler) string {
	s := st.Semaphore
	if s == nil {
		return fmt.Sprintf("semaphore %q: not created yet", st.Name)
	}
	held := make([]string, len(s.Holders))
	for i, h := range s.Holders {
		held[i] = fmt.Sprintf("%s x%d", lab.name(h.Owner), h.Permits)
	}
	return fmt.Sprintf("semaphore %q: %d of %d free, holders [%s], %d queued, %d acquisitions",
		st.Name, s.Available, s.Size, strings.Join(held, " "), len(s.Queue), p.total())
}

func (p *semPart) summary(w io.Writer, elapsed time.Duration, st *Status) []check {
	p.mu.Lock()
	defer p.mu.Unlock()
	var total int64
	starved := 0
	fmt.Fprintf(w, "\nsemaphore %q (%d permits)\n  acquisitions per client:", st.Name, demoSemSize)
	for ci, a := range p.acq {
		fmt.Fprintf(w, " c%d %d", ci+1, a)
		total += a
		if a == 0 {
			starved++
		}
	}
	fmt.Fprintf(w, "\n  total %d (%.0f/s), max wait %v, at most %d permits in use at once\n",
		total, rate(total, elapsed), p.maxWait.Round(time.Millisecond), p.maxInUse.Load())
	errText := "no errors from Redis or the library"
	if len(p.errs) > 0 {
		errText = fmt.Sprintf("%d errors, first: %v", len(p.errs), p.errs[0])
	}
	clean := st.Semaphore == nil || (len(st.Semaphore.Holders) == 0 && len(st.Semaphore.Queue) == 0)
	return []check{
		{p.violations.Load() == 0, fmt.Sprintf("semaphore: never more than %d permits in use (%d times more)", demoSemSize, p.violations.Load())},
		{starved == 0 && total > 0, fmt.Sprintf("semaphore: every client got permits (%d never did)", starved)},
		{len(p.errs) == 0, "semaphore: " + errText},
		{clean, "semaphore: nothing left in Redis: no holders, empty queue"},
	}
}
