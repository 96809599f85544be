// The read-write lock part of the demo.

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

// demoRWWrites is one in how many of the demo's read-write lock
// acquisitions writes; the others read.
const demoRWWrites = 5

// rwPart is the demo of the read-write lock: every worker has its own
// RWMutex value and loops on RLock or Lock, hold, release, pause.
type rwPart struct {
	readers    atomic.Int64 // workers between RLock and RUnlock
	writers    atomic.Int64 // workers between Lock and Unlock
	maxReaders atomic.Int64
	violations atomic.Int64 // times a writer found anyone inside, or a reader a writer

	mu        sync.Mutex
	lastToken int64
	tokenBad  int64   // write tokens not above the previous one
	reads     []int64 // per client
	writes    []int64 // per client
	maxWait   time.Duration
	errs      []error
}

func newRWPart() demoPart { return &rwPart{} }

func (p *rwPart) title(env *demoEnv) string {
	return fmt.Sprintf("the read-write lock %q (1 write in %d)", env.name, demoRWWrites)
}

func (p *rwPart) primitive() redisync.Primitive { return redisync.PrimitiveRWMutex }

func (p *rwPart) start(ctx context.Context, env *demoEnv, wg *sync.WaitGroup) {
	p.reads = make([]int64, len(env.clients))
	p.writes = make([]int64, len(env.clients))
	for ci, c := range env.clients {
		for range env.workers {
			rw, err := c.NewRWMutex(env.name)
			if err != nil {
				p.fail(err)
				return
			}
			wg.Go(func() { p.work(ctx, env, rw, ci) })
		}
	}
}

// work is one worker: it reads or writes until ctx ends.
func (p *rwPart) work(ctx context.Context, env *demoEnv, rw *redisync.RWMutex, ci int) {
	for ctx.Err() == nil {
		write := rand.IntN(demoRWWrites) == 0
		lock, unlock, what := rw.RLock, rw.RUnlock, "RLock"
		if write {
			lock, unlock, what = rw.Lock, rw.Unlock, "Lock"
		}
		t0 := time.Now()
		if err := lock(ctx); err != nil {
			if !ended(ctx, err) {
				p.fail(fmt.Errorf("c%d: %s: %w", ci+1, what, err))
			}
			return
		}
		p.enter(write, rw.Token(), ci, time.Since(t0))
		pause(nil, randUpTo(env.hold))
		if write {
			p.writers.Add(-1)
		} else {
			p.readers.Add(-1)
		}
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := unlock(uctx)
		cancel()
		if err != nil {
			p.fail(fmt.Errorf("c%d: un%s: %w", ci+1, what, err))
			return
		}
		pause(ctx.Done(), randUpTo(env.hold/2))
	}
}

// enter counts a worker of client ci in, a writer with token or a reader,
// after waiting for waited, and checks the lock's rule.
func (p *rwPart) enter(write bool, token int64, ci int, waited time.Duration) {
	if write {
		if p.writers.Add(1) != 1 || p.readers.Load() != 0 {
			p.violations.Add(1)
		}
	} else {
		n := p.readers.Add(1)
		if p.writers.Load() != 0 {
			p.violations.Add(1)
		}
		for old := p.maxReaders.Load(); n > old && !p.maxReaders.CompareAndSwap(old, n); old = p.maxReaders.Load() {
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.maxWait = max(p.maxWait, waited)
	if !write {
		p.reads[ci]++
		return
	}
	p.writes[ci]++
	if token <= p.lastToken {
		p.tokenBad++
	}
	p.lastToken = max(p.lastToken, token)
}

func (p *rwPart) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// counts returns the reads and writes so far.
func (p *rwPart) counts() (reads, writes int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ci := range p.reads {
		reads += p.reads[ci]
		writes += p.writes[ci]
	}
	return reads, writes
}

// holding describes who holds the lock in s.
func holding(s *RWStatus, lab *labeler) string {
	if s.Writer != nil {
		return "written by " + lab.name(s.Writer.Owner)
	}
	if len(s.Readers) == 0 {
		return "free"
	}
	names := make([]string, len(s.Readers))
	for i, r := range s.Readers {
		names[i] = lab.name(r.Owner)
	}
	return fmt.Sprintf("read by %d: %s", len(names), strings.Join(names, ", "))
}

func (p *rwPart) view(st *Status, lab *labeler) []string {
	reads, writes := p.counts()
	lines := []string{fmt.Sprintf("  rwmutex %q   %d reads, %d writes", st.Name, reads, writes)}
	s := st.RWMutex
	if s == nil {
		return append(lines, "    not created yet", "    queue     empty")
	}
	lines = append(lines, "    holders   "+holding(s, lab))
	queue := make([]string, len(s.Queue))
	for i, w := range s.Queue {
		kind := "R"
		if w.Write {
			kind = "W"
		}
		queue[i] = fmt.Sprintf("%d. %s %s", w.Position, lab.name(w.Owner), kind)
	}
	if len(queue) == 0 {
		queue = []string{"empty"}
	}
	return append(lines, "    queue     "+strings.Join(queue, "  "))
}

func (p *rwPart) brief(st *Status, lab *labeler) string {
	s := st.RWMutex
	if s == nil {
		return fmt.Sprintf("rwmutex %q: not created yet", st.Name)
	}
	reads, writes := p.counts()
	return fmt.Sprintf("rwmutex %q: %s, %d queued, %d reads, %d writes", st.Name, holding(s, lab), len(s.Queue), reads, writes)
}

func (p *rwPart) summary(w io.Writer, elapsed time.Duration, st *Status) []check {
	reads, writes := p.counts()
	p.mu.Lock()
	defer p.mu.Unlock()
	starved := 0
	fmt.Fprintf(w, "\nread-write lock %q (1 write in %d)\n  reads/writes per client:", st.Name, demoRWWrites)
	for ci := range p.reads {
		fmt.Fprintf(w, " c%d %d/%d", ci+1, p.reads[ci], p.writes[ci])
		if p.reads[ci]+p.writes[ci] == 0 {
			starved++
		}
	}
	fmt.Fprintf(w, "\n  total %d reads, %d writes (%.0f/s), max wait %v, at most %d readers at once\n",
		reads, writes, rate(reads+writes, elapsed), p.maxWait.Round(time.Millisecond), p.maxReaders.Load())
	errText := "no errors from Redis or the library"
	if len(p.errs) > 0 {
		errText = fmt.Sprintf("%d errors, first: %v", len(p.errs), p.errs[0])
	}
	clean := st.RWMutex == nil || (st.RWMutex.Writer == nil && len(st.RWMutex.Readers) == 0 && len(st.RWMutex.Queue) == 0)
	return []check{
		{p.violations.Load() == 0, fmt.Sprintf("rwmutex: no reader beside a writer, never two writers (%d times otherwise)", p.violations.Load())},
		{p.tokenBad == 0, fmt.Sprintf("rwmutex: write tokens strictly increasing (%d not)", p.tokenBad)},
		{starved == 0 && reads+writes > 0, fmt.Sprintf("rwmutex: every client got in (%d never did)", starved)},
		{len(p.errs) == 0, "rwmutex: " + errText},
		{clean, "rwmutex: nothing left in Redis: no holders, empty queue"},
	}
}
