package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// MultiMutex holds several locks at once, all or none: a transfer between
// two accounts, a job that needs two resources. Each of its names is a
// lock that a Mutex of the same name (and key prefix) excludes, and is
// excluded by.
//
// The names are taken in one global order, by Redis Cluster slot and then
// by name, so that two MultiMutexes whose sets overlap, given their names
// in any order, cannot deadlock: each waits only for a name later in the
// order than every name it holds. Each name is taken as a fair Mutex takes
// it: the call queues for it, in arrival order, and is woken by a message
// when it is handed over, with no polling and no back-off; a stream of
// single-name holders cannot starve it. Where every name is served by one
// script call (one Redis, or names that share a Cluster slot), a first
// attempt takes them all in one call when every one is free and nobody
// queues for it.
//
// A value is one owner, as a Mutex is: Lock on a value that holds the set
// re-enters it, and only the last matching Unlock releases it. Every name
// has its own hold, fencing token and lease, renewed by the Client's
// watchdog; the set has one Lost channel, closed when any name's hold is
// lost. A value is safe for concurrent use; goroutines sharing one value
// share its hold.
type MultiMutex struct {
	c      *Client
	prefix string   // of the keys
	names  []string // in the global order
	locks  []*Mutex // one per name, in that order
	keys   []schema.Lock
	fast   bool // every name is served by one script call
	err    error

	op turn // held by the call of this value that takes or releases

	mu  sync.Mutex // guards cur; taken after a name's Mutex's mu, never before
	cur *hold      // the set's hold (n: the levels re-entered); nil: none
}

// NewMultiMutex returns a MultiMutex for the locks called names, with the
// options of a Mutex, which apply to each name: each name's hold has the
// lease, label and metadata they set. Barging makes each name barge, as a
// Mutex would: then a stream of single-name holders can starve the set.
// It does no I/O. Bad input
// is reported by every call of the MultiMutex, before any call to Redis:
// ErrNoNames for no names, ErrDuplicateName for a name given twice,
// ErrInvalidName and ErrInvalidOption as NewMutex reports them.
func (c *Client) NewMultiMutex(names []string, opts ...MutexOption) *MultiMutex {
	cfg := with(c.cfg, opts, MutexOption.applyMutex)
	m := &MultiMutex{c: c, prefix: cfg.prefix, op: newTurn()}
	m.names, m.err = lockOrder(cfg.prefix, names)
	m.err = cmp.Or(m.err, cfg.err)
	if m.err != nil {
		m.names = slices.Clone(names)
		return m
	}
	for _, name := range m.names {
		l := c.newMutex(name, cfg)
		l.onLost = m.partLost // called with l.mu held
		m.locks = append(m.locks, l)
		m.keys = append(m.keys, l.keys)
	}
	m.fast = oneCall(c, m.keys)
	return m
}

// lockOrder checks names and returns them in the order every MultiMutex
// takes them: by the Redis Cluster slot of their keys under prefix, then
// by name.
func lockOrder(prefix string, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, ErrNoNames
	}
	slot := make(map[string]uint16, len(names))
	for _, name := range names {
		if err := checkName(name); err != nil {
			return nil, err
		}
		if _, dup := slot[name]; dup {
			return nil, fmt.Errorf("%w: %s", ErrDuplicateName, quote(name))
		}
		slot[name] = schema.Slot(schema.LockKeys(prefix, name).Hash)
	}
	sorted := slices.Clone(names)
	slices.SortFunc(sorted, func(a, b string) int {
		return cmp.Or(cmp.Compare(slot[a], slot[b]), strings.Compare(a, b))
	})
	return sorted, nil
}

// oneCall reports whether one script call can take the locks ks of the
// Client c: on one Redis always; on a Cluster when they share a slot.
func oneCall(c *Client, ks []schema.Lock) bool {
	same := func(f func(string) string) bool {
		for _, k := range ks[1:] {
			if f(k.Hash) != f(ks[0].Hash) {
				return false
			}
		}
		return true
	}
	if c.cluster == nil {
		return true
	}
	return same(func(key string) string { return fmt.Sprint(schema.Slot(key)) })
}

// Lock blocks until m holds every one of its locks, ctx ends or the Client
// is closed. If m already holds them, Lock re-enters at once.
//
// It takes the names one at a time in the global order (see MultiMutex),
// each as a fair Mutex's Lock takes it, after a first attempt at taking
// them all in one script call where they share a slot. When ctx ends or
// an error occurs part-way, Lock releases the names it took and withdraws
// from the queue it waited in, and returns the error: it holds all or
// none. When m's hold was lost, or a name's hold was lost before the last
// name was taken (under WithLease, a lease shorter than the wait), Lock
// releases what is left of it and takes the set anew. It returns
// ErrClosed after Close, and the errors of Redis, as Mutex.Lock does. It
// is safe for concurrent use: a call waits for another call of m under
// way (another goroutine's Lock or Unlock) to end.
func (m *MultiMutex) Lock(ctx context.Context) error {
	return observed(m.c.obs, ctx, m.call(OpLock), m.lock, nil)
}

// lock is Lock, unobserved.
func (m *MultiMutex) lock(ctx context.Context) error {
	if m.err != nil {
		return m.wrap("lock", m.err)
	}
	leave, err := m.c.enter(ctx, m.keys[0].GrantChannel(m.c.id))
	if err != nil {
		return m.wrap("lock", err)
	}
	defer leave()
	ctx, stop := marked(ctx)
	defer stop()
	if err := m.begin(ctx, true, true); err != nil {
		return m.wrap("lock", err)
	}
	defer m.end()
	if m.reenter(ctx, true) {
		return nil
	}
	for {
		if m.fast {
			if ok, err := m.takeAll(ctx); ok || err != nil {
				return m.wrapIf("lock", err)
			}
		}
		if err := m.lockEach(ctx); err != nil {
			return m.wrap("lock", err)
		}
		if m.commit(ctx) {
			return nil
		}
	}
}

// lockEach takes every name of m, one at a time in the global order, each
// as a fair Mutex's Lock takes it. When one fails, it gives back those it
// took.
func (m *MultiMutex) lockEach(ctx context.Context) error {
	for i, l := range m.locks {
		if err := l.lock(ctx); err != nil {
			_ = m.giveBack(ctx, m.locks[:i])
			return err
		}
	}
	return nil
}

// TryLock makes one attempt to take every lock of m and never waits: it
// reports whether m holds them all now (re-entering if it already did;
// false, with no call to Redis, while another call of m is taking or
// releasing the set). It does not take a lock ahead of its queued
// waiters. Where the names share a slot it is one script call; otherwise
// it tries the names one at a time in the global order, and gives back
// those it took when one is not free.
func (m *MultiMutex) TryLock(ctx context.Context) (bool, error) {
	return observedTry(m.c.obs, ctx, m.call(OpTryLock), m.tryLock, nil)
}

// tryLock is TryLock, unobserved.
func (m *MultiMutex) tryLock(ctx context.Context) (bool, error) {
	if m.err != nil {
		return false, m.wrap("trylock", m.err)
	}
	leave, err := m.c.enter(ctx, m.keys[0].GrantChannel(m.c.id))
	if err != nil {
		return false, m.wrap("trylock", err)
	}
	defer leave()
	ctx, stop := marked(ctx)
	defer stop()
	if m.reenter(ctx, false) {
		return true, nil
	}
	switch err := m.begin(ctx, true, false); {
	case errors.Is(err, errBusy):
		return false, nil // another call of m is taking or releasing the set
	case err != nil:
		return false, m.wrap("trylock", err)
	}
	defer m.end()
	if m.reenter(ctx, true) {
		return true, nil
	}
	if m.fast {
		ok, err := m.takeAll(ctx)
		return ok, m.wrapIf("trylock", err)
	}
	for i, l := range m.locks {
		if ok, err := l.tryLock(ctx); !ok || err != nil {
			_ = m.giveBack(ctx, m.locks[:i])
			return false, m.wrapIf("trylock", err)
		}
	}
	return m.commit(ctx), nil
}

// Unlock releases one level of m's hold; the last level releases every
// lock of the set, at once, each going to its next fair waiter. It returns
// ErrNotHeld when m holds nothing, and ErrLockLost when the hold had been
// lost (a name's hold was: another owner may have taken that name since);
// it never touches another owner's hold. A name whose release fails does
// not keep the others from being released: the error says which, and that
// name is freed by Redis within its lease, no longer renewed. Like
// Mutex.Unlock, it releases even when ctx has ended already.
func (m *MultiMutex) Unlock(ctx context.Context) error {
	return observed(m.c.obs, ctx, m.call(OpUnlock), m.unlock, nil)
}

// unlock is Unlock, unobserved.
func (m *MultiMutex) unlock(ctx context.Context) error {
	if m.err != nil {
		return m.wrap("unlock", m.err)
	}
	if done, err := m.unlevel(); done {
		return m.wrapIf("unlock", err)
	}
	wait, cancel := releasing(ctx)
	defer cancel()
	if err := m.begin(wait, false, true); err != nil {
		return m.wrap("unlock", err)
	}
	defer m.end()
	if done, err := m.unlevel(); done {
		return m.wrapIf("unlock", err)
	}
	m.mu.Lock()
	h := m.cur
	lost := h.isLost
	end(h, ErrReleased) // a lost hold ended already, as lost
	m.cur = nil
	m.mu.Unlock()
	err := m.releaseAll(wait)
	if lost {
		err = errors.Join(ErrLockLost, err)
	}
	return m.wrapIf("unlock", err)
}

// unlevel drops one level of m's hold when it has more than one, or finds
// it has none: then it reports done, with the outcome.
func (m *MultiMutex) unlevel() (done bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch h := m.cur; {
	case h == nil:
		return true, ErrNotHeld
	case h.n > 1:
		h.n--
		if h.isLost {
			return true, ErrLockLost
		}
		return true, nil
	}
	return false, nil
}

// Tokens returns the fencing token of each name's hold, by name, or nil
// when m does not hold the set. Each name's tokens strictly increase from
// one hold to the next, as a Mutex's do, whoever takes it.
func (m *MultiMutex) Tokens() map[string]int64 {
	if m.current() == nil {
		return nil
	}
	tokens := make(map[string]int64, len(m.locks))
	for _, l := range m.locks {
		tokens[l.name] = l.Token()
	}
	return tokens
}

// Token returns the fencing token of the hold of the name, or 0 when m
// does not hold the set or name is not one of its names.
func (m *MultiMutex) Token(name string) int64 {
	i := slices.Index(m.names, name)
	if i < 0 || m.current() == nil {
		return 0
	}
	return m.locks[i].Token()
}

// Lost returns a channel that is closed when m's current hold is lost:
// the hold of any of its names is lost, as a Mutex's is (see Mutex.Lost),
// or the Client was closed. A normal Unlock does not close it. When m
// holds nothing, Lost returns nil.
func (m *MultiMutex) Lost() <-chan struct{} {
	if h := m.current(); h != nil {
		return h.lost
	}
	return nil
}

// HoldContext returns a context derived from parent that is cancelled
// when m's current hold ends, as Mutex.HoldContext's: context.Cause then
// says ErrLockLost (lost, the Lost channel closed) or ErrReleased (the
// last Unlock). Without a hold it is cancelled at once with ErrNotHeld.
func (m *MultiMutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return holdContext(&m.mu, m.cur, parent)
}

// Do locks m, runs fn with m's HoldContext, and unlocks m, as Mutex.Do.
func (m *MultiMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return do(ctx, &m.mu, &m.cur, m.Lock, m.Unlock, fn)
}

// Names returns m's names in the order they are taken: by Redis Cluster
// slot, then by name.
func (m *MultiMutex) Names() []string { return slices.Clone(m.names) }

// current returns m's hold, or nil.
func (m *MultiMutex) current() *hold {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur
}

// reenter adds a level to m's hold, if m has one. A hold that was lost is
// dropped instead (its Lost channel stays closed), and what is left of it
// released, so that the caller takes the set anew; unless the caller does
// not have m's turn (turn false): then it is left as it is.
func (m *MultiMutex) reenter(ctx context.Context, turn bool) bool {
	m.mu.Lock()
	h := m.cur
	switch {
	case h == nil || h.isLost && !turn:
		m.mu.Unlock()
		return false
	case h.isLost:
		m.cur = nil
		m.mu.Unlock()
		_ = m.giveBack(ctx, m.locks)
		return false
	}
	h.n++
	m.mu.Unlock()
	noteHold(ctx, h)
	return true
}

// commit makes the holds of every name m's hold, one level deep, unless
// one of them was lost already (a lease that ran out while the call waited
// for a later name): then it gives them all back and reports false. The
// names are looked at under m.mu, where the hold is made visible: a loss
// told later finds m.cur (partLost), and no other call of m can re-enter
// a hold that is then thrown away.
func (m *MultiMutex) commit(ctx context.Context) bool {
	// Read before m.mu: a name's Mutex takes its own lock, then m.mu, when
	// it tells a loss (partLost).
	lost := make([]<-chan struct{}, len(m.locks))
	for i, l := range m.locks {
		lost[i] = l.Lost()
	}
	h := &hold{n: 1, lost: make(chan struct{}), taken: time.Now()}
	m.mu.Lock()
	for _, c := range lost {
		select {
		case <-c:
			m.mu.Unlock()
			_ = m.giveBack(ctx, m.locks)
			return false
		default:
		}
	}
	m.cur = h
	m.mu.Unlock()
	noteHold(ctx, h)
	return true
}

// partLost records that a name's hold was lost: so is m's. It is called by
// the name's Mutex with its mu held.
func (m *MultiMutex) partLost() {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.cur
	if h == nil || h.isLost {
		return
	}
	h.isLost = true
	close(h.lost)
	end(h, ErrLockLost)
}

// giveBack releases the holds of locks, all at once, and returns their
// errors but ErrNotHeld (a name m does not hold has nothing to release).
// When ctx has ended (a Lock that gave up part-way), it waits for them at
// most cleanupWait after that: they go on in the background, no longer
// renewed.
func (m *MultiMutex) giveBack(ctx context.Context, locks []*Mutex) error {
	if ended(ctx) != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), graceEnd(ctx))
		defer cancel()
	}
	errs := make([]error, len(locks))
	var wg sync.WaitGroup
	for i, l := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.unlock(ctx); !errors.Is(err, ErrNotHeld) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// errBusy is returned by begin, not waiting, when another call of the
// value has its turn.
var errBusy = errors.New("redisync: another call of the value is under way")

// begin checks that m can be used (usable: and its Client, for a call
// that takes) and takes m's turn to take or release: waiting for it, or
// else failing with errBusy when another call of m has it.
func (m *MultiMutex) begin(ctx context.Context, usable, wait bool) error {
	if m.err != nil {
		return m.err
	}
	if usable {
		if err := cmp.Or(m.c.usable(), ctx.Err()); err != nil {
			return err
		}
	}
	if !wait {
		if !m.op.try() {
			return errBusy
		}
		return nil
	}
	return m.op.take(ctx, nil)
}

// end gives back m's turn.
func (m *MultiMutex) end() { m.op.give() }

// label names m in errors and to an Observer: its names joined with "+".
func (m *MultiMutex) label() string { return strings.Join(m.names, "+") }

// call is how a call of m is told to an Observer.
func (m *MultiMutex) call(op Op) Call {
	return Call{Op: op, Primitive: PrimitiveMultiMutex, Name: m.label()}
}

// wrap adds the operation and the names to err.
func (m *MultiMutex) wrap(op string, err error) error {
	return wrapOp(op, m.label(), err)
}

// wrapIf is wrap, and nil for a nil err.
func (m *MultiMutex) wrapIf(op string, err error) error {
	if err == nil {
		return nil
	}
	return m.wrap(op, err)
}
