// The multi-lock part of the demo.

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

// demoAccounts is how many accounts the multi-lock part moves money
// between, each starting with demoBalance.
const (
	demoAccounts = 4
	demoBalance  = 100
)

// multiPart is the demo of the multi-lock: every worker transfers between
// two accounts, chosen at random and named in a random order, under a
// MultiMutex of both. The balances are read, and written back after the
// simulated work, with nothing but the locks to keep two transfers of one
// account apart: a transfer inside another would lose money.
type multiPart struct {
	env        *demoEnv
	balance    [demoAccounts]atomic.Int64
	holder     [demoAccounts]atomic.Int32 // 1 + worker number inside; 0: none
	violations atomic.Int64               // times a transfer found an account held by another

	mu      sync.Mutex
	acq     [][]int64 // [client][worker] transfers
	maxWait time.Duration
	errs    []error
}

func newMultiPart() demoPart { return &multiPart{} }

// account returns the lock name of account i.
func (p *multiPart) account(i int) string { return fmt.Sprintf("%s:acct%d", p.env.name, i+1) }

func (p *multiPart) title(env *demoEnv) string {
	return fmt.Sprintf("transfers between %d accounts %q, each under a multi-lock of 2", demoAccounts, env.name+":acct*")
}

func (p *multiPart) primitive() redisync.Primitive { return redisync.PrimitiveMultiMutex }

func (p *multiPart) start(ctx context.Context, env *demoEnv, wg *sync.WaitGroup) {
	p.env = env
	for i := range p.balance {
		p.balance[i].Store(demoBalance)
	}
	p.acq = make([][]int64, len(env.clients))
	for ci, c := range env.clients {
		p.acq[ci] = make([]int64, env.workers)
		for wi := range env.workers {
			wg.Go(func() { p.work(ctx, c, ci, wi) })
		}
	}
}

// work is one worker: it makes transfers until ctx ends.
func (p *multiPart) work(ctx context.Context, c *redisync.Client, ci, wi int) {
	me := int32(ci*64 + wi + 1)
	for ctx.Err() == nil {
		from := rand.IntN(demoAccounts)
		to := (from + 1 + rand.IntN(demoAccounts-1)) % demoAccounts
		m, err := c.NewMultiMutex([]string{p.account(from), p.account(to)})
		if err != nil {
			p.fail(err)
			return
		}
		t0 := time.Now()
		if err := m.Lock(ctx); err != nil {
			if !ended(ctx, err) {
				p.fail(fmt.Errorf("c%d.w%d: Lock: %w", ci+1, wi+1, err))
			}
			return
		}
		p.record(ci, wi, time.Since(t0))
		for _, a := range []int{from, to} {
			if !p.holder[a].CompareAndSwap(0, me) {
				p.violations.Add(1)
			}
		}
		amount := 1 + rand.Int64N(10)
		a, b := p.balance[from].Load(), p.balance[to].Load()
		pause(nil, randUpTo(p.env.hold)) // the work under the locks always ends
		p.balance[from].Store(a - amount)
		p.balance[to].Store(b + amount)
		for _, a := range []int{from, to} {
			p.holder[a].CompareAndSwap(me, 0)
		}

		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = m.Unlock(uctx)
		cancel()
		if err != nil {
			p.fail(fmt.Errorf("c%d.w%d: Unlock: %w", ci+1, wi+1, err))
			return
		}
		pause(ctx.Done(), randUpTo(p.env.hold/2))
	}
}

func (p *multiPart) record(ci, wi int, waited time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acq[ci][wi]++
	p.maxWait = max(p.maxWait, waited)
}

func (p *multiPart) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// transfers returns the transfers so far, and how many workers made none.
func (p *multiPart) transfers() (total int64, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ws := range p.acq {
		for _, n := range ws {
			total += n
			if n == 0 {
				idle++
			}
		}
	}
	return total, idle
}

// accounts draws each account's balance and who holds it.
func (p *multiPart) accounts() (string, int64) {
	var b strings.Builder
	var sum int64
	for i := range p.balance {
		bal := p.balance[i].Load()
		sum += bal
		who := "-"
		if h := p.holder[i].Load(); h != 0 {
			who = fmt.Sprintf("c%d.w%d", (h-1)/64+1, (h-1)%64+1)
		}
		fmt.Fprintf(&b, " acct%d %4d %-6s", i+1, bal, who)
	}
	return b.String(), sum
}

func (p *multiPart) view(*Status, *labeler) []string {
	total, _ := p.transfers()
	accts, sum := p.accounts()
	return []string{
		fmt.Sprintf("  multi-lock: transfers between 2 of %d accounts   %d transfers", demoAccounts, total),
		"    balance, holder" + accts,
		fmt.Sprintf("    total     %d of %d", sum, demoAccounts*demoBalance),
	}
}

func (p *multiPart) brief(*Status, *labeler) string {
	total, _ := p.transfers()
	_, sum := p.accounts()
	return fmt.Sprintf("multi-lock: %d transfers, total balance %d", total, sum)
}

func (p *multiPart) summary(w io.Writer, elapsed time.Duration, _ *Status) []check {
	total, idle := p.transfers()
	accts, sum := p.accounts()
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(w, "\nmulti-lock: transfers between 2 of %d accounts\n  balances:%s\n  total %d transfers (%.0f/s), max wait %v\n",
		demoAccounts, accts, total, rate(total, elapsed), p.maxWait.Round(time.Millisecond))
	errText := "no errors from Redis or the library"
	if len(p.errs) > 0 {
		errText = fmt.Sprintf("%d errors, first: %v", len(p.errs), p.errs[0])
	}
	left := 0
	if p.env != nil { // nil in tests of the checks alone
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for i := range demoAccounts {
			st, err := readStatus(ctx, p.env.rdb, p.env.prefix, p.account(i), false)
			if err != nil || st.Lock.Holder != nil || len(st.Lock.Queue) > 0 {
				left++
			}
		}
	}
	return []check{
		{p.violations.Load() == 0, fmt.Sprintf("multi-lock: no account in two transfers at once (%d times)", p.violations.Load())},
		{sum == demoAccounts*demoBalance, fmt.Sprintf("multi-lock: no money lost or made (total %d of %d)", sum, demoAccounts*demoBalance)},
		{idle == 0 && total > 0, fmt.Sprintf("multi-lock: every worker made a transfer (%d never did)", idle)},
		{len(p.errs) == 0, "multi-lock: " + errText},
		{left == 0, fmt.Sprintf("multi-lock: nothing left in Redis: every account free, no queue (%d not)", left)},
	}
}
