package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redisync/redisync"
)

// electPart is the demo of leader election: each client is one candidate
// (its value "c1", "c2", ...) that campaigns, leads for a while, resigns
// and campaigns again; an observer on the first client follows every
// change of leader.
type electPart struct {
	leading    atomic.Int32 // candidates between Campaign and Resign
	violations atomic.Int64 // times a candidate found another one leading

	mu        sync.Mutex
	lastToken int64
	tokenBad  int64   // tokens not above the previous one
	terms     []int64 // [client] terms led
	errs      []error

	// What the observer saw.
	changes, gaps, disorder int64
	last                    redisync.Leadership
}

func newElectPart() demoPart { return &electPart{} }

func (p *electPart) title(env *demoEnv) string { return fmt.Sprintf("the election %q", env.name) }

func (p *electPart) primitive() redisync.Primitive { return redisync.PrimitiveElection }

func (p *electPart) start(ctx context.Context, env *demoEnv, wg *sync.WaitGroup) {
	p.terms = make([]int64, len(env.clients))
	observer, err := env.clients[0].NewElection(env.name)
	if err != nil {
		p.fail(err)
		return
	}
	wg.Go(func() {
		for l, err := range observer.Observe(ctx) {
			if err != nil {
				if !ended(ctx, err) {
					p.fail(fmt.Errorf("Observe: %w", err))
				}
				return
			}
			p.observed(l)
		}
	})
	for ci, c := range env.clients {
		e, err := c.NewElection(env.name)
		if err != nil {
			p.fail(err)
			return
		}
		wg.Go(func() { p.campaign(ctx, env, e, ci) })
	}
}

// campaign is one candidate: it campaigns until ctx ends.
func (p *electPart) campaign(ctx context.Context, env *demoEnv, e *redisync.Election, ci int) {
	value := fmt.Sprintf("c%d", ci+1)
	for ctx.Err() == nil {
		if err := e.Campaign(ctx, value); err != nil {
			if !ended(ctx, err) {
				p.fail(fmt.Errorf("%s: Campaign: %w", value, err))
			}
			return
		}
		if p.leading.Add(1) != 1 {
			p.violations.Add(1)
		}
		p.record(e.Token(), ci)
		pause(e.Lost(), randUpTo(3*env.hold)) // leads a while, unless the leadership is lost
		p.leading.Add(-1)

		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := e.Resign(rctx)
		cancel()
		if err != nil && !errors.Is(err, redisync.ErrLockLost) { // a lost leadership is resigned too
			p.fail(fmt.Errorf("%s: Resign: %w", value, err))
			return
		}
		pause(ctx.Done(), randUpTo(env.hold))
	}
}

// record counts a term with token led by client ci.
func (p *electPart) record(token int64, ci int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if token <= p.lastToken {
		p.tokenBad++
	}
	p.lastToken = max(p.lastToken, token)
	p.terms[ci]++
}

// observed counts a change the observer saw.
func (p *electPart) observed(l redisync.Leadership) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A revision repeats only when a leader's lease ran out unannounced.
	expired := l.Revision == p.last.Revision && p.last.Leads() && !l.Leads()
	if l.Revision <= p.last.Revision && p.changes > 0 && !expired {
		p.disorder++
	}
	p.last = l
	p.changes++
	if l.Gap {
		p.gaps++
	}
}

func (p *electPart) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// total returns the terms led so far.
func (p *electPart) total() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, t := range p.terms {
		n += t
	}
	return n
}

// leader describes the leader in st.
func leader(st *Status) string {
	if e := st.Election; e != nil && e.Leader != nil {
		return fmt.Sprintf("%s (token %d)", e.Leader.Metadata, e.Leader.Token)
	}
	return "nobody"
}

// candidates lists the values of the candidates waiting in st, in order.
func candidates(st *Status) []string {
	var vs []string
	if e := st.Election; e != nil {
		for _, w := range e.Candidates {
			vs = append(vs, w.Metadata)
		}
	}
	return vs
}

func (p *electPart) view(st *Status, _ *labeler) []string {
	p.mu.Lock()
	changes, gaps := p.changes, p.gaps
	p.mu.Unlock()
	queue := "none"
	if vs := candidates(st); len(vs) > 0 {
		queue = strings.Join(vs, " ")
	}
	return []string{
		fmt.Sprintf("  election %q   %d terms", st.Name, p.total()),
		"    leader     " + leader(st),
		"    waiting    " + queue,
		fmt.Sprintf("    observer   %d changes seen, %d after a gap", changes, gaps),
	}
}

func (p *electPart) brief(st *Status, _ *labeler) string {
	return fmt.Sprintf("election %q: leader %s, waiting [%s], %d terms", st.Name, leader(st), strings.Join(candidates(st), " "), p.total())
}

func (p *electPart) summary(w io.Writer, elapsed time.Duration, st *Status) []check {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(w, "\nelection %q\n  candidate  terms\n", st.Name)
	var total int64
	never := 0
	for ci, n := range p.terms {
		fmt.Fprintf(w, "  c%-9d %5d\n", ci+1, n)
		total += n
		if n == 0 {
			never++
		}
	}
	fmt.Fprintf(w, "  total      %5d   (%.0f/s); the observer saw %d changes, %d of them read after a gap\n",
		total, rate(total, elapsed), p.changes, p.gaps)
	left, clean := "nothing left in Redis: no leader, no candidate waiting", true
	if e := st.Election; e != nil && (e.Leader != nil || len(e.Candidates) > 0) {
		clean = false
		left = fmt.Sprintf("left in Redis after every client closed: leader %v, %d waiting", e.Leader != nil, len(e.Candidates))
	}
	errText := "no errors from Redis or the library"
	if len(p.errs) > 0 {
		errText = fmt.Sprintf("%d errors, first: %v", len(p.errs), p.errs[0])
	}
	return []check{
		{p.violations.Load() == 0, fmt.Sprintf("election: one leader at a time, %d times two led at once", p.violations.Load())},
		{p.tokenBad == 0, fmt.Sprintf("election: fencing tokens grew with every leader (%d out of order)", p.tokenBad)},
		{never == 0 && total > 0, fmt.Sprintf("election: every candidate led (%d of %d never did)", never, len(p.terms))},
		{p.disorder == 0 && p.changes > 0, fmt.Sprintf("election: the observer saw changes in order, each once (%d out of order or repeated)", p.disorder)},
		{len(p.errs) == 0, "election: " + errText},
		{clean, "election: " + left},
	}
}
