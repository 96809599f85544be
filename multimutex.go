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

	"github.com/redisync/redisync/internal/roundtrip"
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
// A MultiMutex value is used as a Mutex is: goroutines that share it
// exclude each other, each Lock call taking the set on its own; it is
// reentrant through the hold's context (Do's, HoldContext's), and Unlock
// may come from any goroutine. Every name has its own hold, fencing token
// and lease, renewed by the Client's watchdog; the set has one Lost
// channel, closed when any name's hold is lost. A lost set stays the
// value's until its last Unlock, as a Mutex's lost hold does.
//
// Make a MultiMutex with Client.NewMultiMutex: every call of a zero
// MultiMutex fails with ErrInvalid.
type MultiMutex struct {
	c     *Client
	cfg   config
	names []string // in the global order
	keys  []schema.Lock
	fast  bool // every name is served by one script call

	mu   sync.Mutex    // guards cur; taken after a name's Mutex's mu, never before
	cur  *hold         // the set's hold (n: the levels re-entered; parts: a Mutex per name), lost or not, until its last Unlock; nil: none
	free chan struct{} // closed when cur, the hold it was made for, is forgotten
}

// MaxMultiNames is the most names a MultiMutex takes. Where its names
// share a slot, one script call takes them all, and one releases them all,
// and Redis serves nobody else while a script runs: such a call costs
// about 10 to 20 µs of the server's time per name (Redis 7.0; a release
// that hands every name on to a waiter costs the most), so that at most
// MaxMultiNames names keep it under a millisecond. More names are
// reported as ErrTooManyNames, before any call to Redis; the scripts
// refuse them too (ErrInvalidOption), whoever calls them.
const MaxMultiNames = 32

// NewMultiMutex returns a MultiMutex for the locks called names, with the
// options of a Mutex, which apply to each name: each name's hold has the
// lease, label and metadata they set. Barging makes each name barge, as a
// Mutex would: then a stream of single-name holders can starve the set.
// It does no I/O. It fails with an *OpError (each cause wraps ErrInvalid
// too) wrapping ErrNoNames for no names, ErrTooManyNames for more than
// MaxMultiNames names, ErrDuplicateName for a name given twice, and
// ErrInvalidName and ErrInvalidOption as NewMutex does.
func (c *Client) NewMultiMutex(names []string, opts ...Option) (*MultiMutex, error) {
	cfg := with(c.cfg, atMutex, opts)
	sorted, err := lockOrder(cfg.prefix, names)
	if err = cmp.Or(err, cfg.err); err != nil {
		return nil, wrapOp("new multimutex", strings.Join(names, "+"), err)
	}
	m := &MultiMutex{c: c, cfg: cfg, names: sorted}
	for _, name := range m.names {
		m.keys = append(m.keys, schema.LockKeys(cfg.prefix, name))
	}
	m.fast = oneCall(c, m.keys)
	return m, nil
}

// lockOrder checks names and returns them in the order every MultiMutex
// takes them: by the Redis Cluster slot of their keys under prefix, then
// by name.
func lockOrder(prefix string, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, ErrNoNames
	}
	if len(names) > MaxMultiNames {
		return nil, fmt.Errorf("%w: %d names, more than MaxMultiNames (%d)", ErrTooManyNames, len(names), MaxMultiNames)
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

// Lock blocks until every one of m's locks is held for this call, ctx
// ends or the Client is closed. When ctx carries m's hold (Do's,
// HoldContext's), Lock re-enters it at once.
//
// It takes the names one at a time in the global order (see MultiMutex),
// each as a fair Mutex's Lock takes it, after a first attempt at taking
// them all in one script call where they share a slot. When ctx ends or
// an error occurs part-way, Lock releases the names it took and withdraws
// from the queue it waited in, and returns the error: it holds all or
// none. When a name's hold is lost before the last name was taken (under
// WithFixedLease, a lease shorter than the wait), Lock releases what is left of
// the set and takes it anew. It returns ErrQueueFull when a name's queue
// is full (WithMaxWaiters), ErrClosed after Close, and the errors of
// Redis, as Mutex.Lock does. It is safe for concurrent use.
func (m *MultiMutex) Lock(ctx context.Context) error {
	return observed(m.c.observer(), ctx, m.call(OpLock), m.lock, nil)
}

// lock is Lock, unobserved.
func (m *MultiMutex) lock(ctx context.Context) error {
	if h := holdIn(ctx, m); h != nil {
		return m.wrapIf("lock", m.reenter(ctx, h))
	}
	if err := m.usable(ctx); err != nil {
		return m.wrap("lock", err)
	}
	leave, err := m.c.enter(ctx, m.keys[0].GrantChannel(m.c.id))
	if err != nil {
		return m.wrap("lock", err)
	}
	defer leave()
	if err := owedUnlock(ctx, &m.mu, m.owed, m.c.ctx.Done(), true); err != nil {
		return m.wrap("lock", err)
	}
	ctx, stop := roundtrip.Marked(ctx)
	defer stop()
	for {
		h := m.newHold()
		took := false
		if m.fast {
			if took, err = m.takeAll(ctx, h.parts); err != nil {
				return m.wrap("lock", err)
			}
		}
		if !took {
			if err := m.lockEach(ctx, h.parts); err != nil {
				return m.wrap("lock", err)
			}
		}
		switch err := m.commit(ctx, h, true); {
		case errors.Is(err, errBusy):
			// m's last hold was lost and its Unlock is owed: wait
			// for it holding nothing, then take the names again.
			if err := owedUnlock(ctx, &m.mu, m.owed, m.c.ctx.Done(), true); err != nil {
				return m.wrap("lock", err)
			}
		case !errors.Is(err, ErrLockLost):
			return m.wrapIf("lock", err)
		}
	}
}

// lockEach takes every name of locks, one at a time in the global order,
// each as a fair Mutex's Lock takes it. When one fails, it gives back those
// it took.
func (m *MultiMutex) lockEach(ctx context.Context, locks []*Mutex) error {
	for i, l := range locks {
		if err := l.lock(ctx); err != nil {
			_ = m.giveBack(ctx, locks[:i])
			return err
		}
	}
	return nil
}

// TryLock makes one attempt to take every lock of m and never waits: it
// reports whether they are all held for this call now (false while
// another goroutine of m holds them). When ctx carries m's hold, it
// re-enters it, as Lock does. It does not take a lock ahead of its
// queued waiters. Where the names share a slot it is one script call;
// otherwise it tries the names one at a time in the global order, and
// gives back those it took when one is not free.
func (m *MultiMutex) TryLock(ctx context.Context) (bool, error) {
	return observedTry(m.c.observer(), ctx, m.call(OpTryLock), m.tryLock, nil)
}

// tryLock is TryLock, unobserved.
func (m *MultiMutex) tryLock(ctx context.Context) (bool, error) {
	if h := holdIn(ctx, m); h != nil {
		err := m.reenter(ctx, h)
		return err == nil, m.wrapIf("trylock", err)
	}
	if err := m.usable(ctx); err != nil {
		return false, m.wrap("trylock", err)
	}
	leave, err := m.c.enter(ctx, m.keys[0].GrantChannel(m.c.id))
	if err != nil {
		return false, m.wrap("trylock", err)
	}
	defer leave()
	if owedUnlock(ctx, &m.mu, m.owed, m.c.ctx.Done(), false) != nil {
		return false, nil // a lost hold of m still owes its Unlock
	}
	ctx, stop := roundtrip.Marked(ctx)
	defer stop()
	h := m.newHold()
	if m.fast {
		if ok, err := m.takeAll(ctx, h.parts); !ok || err != nil {
			return false, m.wrapIf("trylock", err)
		}
	} else {
		for i, l := range h.parts {
			if ok, err := l.tryLock(ctx); !ok || err != nil {
				_ = m.giveBack(ctx, h.parts[:i])
				return false, m.wrapIf("trylock", err)
			}
		}
	}
	switch err := m.commit(ctx, h, false); {
	case errors.Is(err, ErrLockLost), errors.Is(err, errBusy):
		return false, nil
	case err != nil:
		return false, m.wrap("trylock", err)
	}
	return true, nil
}

// Unlock releases one level of m's hold: of the hold ctx carries (see
// Lock), or else of the value's hold, whichever goroutine took it. The
// last level releases every lock of the set, at once, each going to its
// next fair waiter. It returns ErrNotHeld when m holds nothing, and
// ErrLockLost when the hold had been lost (a name's hold was: another
// owner may have taken that name since); it never touches another owner's
// hold, nor a later hold of m. A name whose release fails does not keep
// the others from being released: the error says which, and that name is
// freed by Redis within its lease, no longer renewed. Like Mutex.Unlock,
// it releases even when ctx has ended already.
func (m *MultiMutex) Unlock(ctx context.Context) error {
	return observed(m.c.observer(), ctx, m.call(OpUnlock), m.unlock, nil)
}

// unlock is Unlock, unobserved.
func (m *MultiMutex) unlock(ctx context.Context) error {
	if err := m.c.made(); err != nil {
		return m.wrap("unlock", err)
	}
	m.mu.Lock()
	h := holdIn(ctx, m)
	switch {
	case h == nil:
		h = m.cur
	case h != m.cur:
		h = nil // unlocked already: released, or lost and forgotten
	}
	switch {
	case h == nil:
		m.mu.Unlock()
		return m.wrap("unlock", ErrNotHeld)
	case h.n > 1:
		h.n--
		lost := h.isLost
		m.mu.Unlock()
		if lost {
			return m.wrap("unlock", ErrLockLost)
		}
		return nil
	}
	lost := h.isLost
	end(h, ErrReleased) // a lost hold ended already, as lost
	if m.cur == h {
		m.cur = nil
		close(m.free)
	}
	m.mu.Unlock()
	wait, cancel := roundtrip.Releasing(ctx)
	defer cancel()
	err := m.releaseAll(wait, h.parts)
	if lost {
		err = errors.Join(ErrLockLost, err)
	}
	return m.wrapIf("unlock", err)
}

// Tokens returns the fencing token of each name's hold, by name, or nil
// when m does not hold the set. Each name's tokens strictly increase from
// one hold to the next, as a Mutex's do, whoever takes it.
func (m *MultiMutex) Tokens() map[string]int64 {
	h := m.current()
	if h == nil {
		return nil
	}
	tokens := make(map[string]int64, len(h.parts))
	for _, l := range h.parts {
		tokens[l.name] = l.Token()
	}
	return tokens
}

// Token returns the fencing token of the hold of m's first name in
// Names() order, or 0 when m does not hold the set. It is the token a
// caller that treats the set as one lock passes on; a resource guarded by
// one name of the set should check that name's token (TokenOf), since
// each name's tokens increase on their own.
func (m *MultiMutex) Token() int64 {
	h := m.current()
	if h == nil {
		return 0
	}
	return h.parts[0].Token()
}

// TokenOf returns the fencing token of the hold of the name, or 0 when m
// does not hold the set or name is not one of its names.
func (m *MultiMutex) TokenOf(name string) int64 {
	i := slices.Index(m.names, name)
	h := m.current()
	if i < 0 || h == nil {
		return 0
	}
	return h.parts[i].Token()
}

// Lost returns a channel that is closed when m's current hold is lost:
// the hold of any of its names is lost, as a Mutex's is (see Mutex.Lost),
// or the Client was closed. A normal Unlock does not close it. When m
// holds nothing, Lost returns a closed channel: take it after Lock
// succeeds.
func (m *MultiMutex) Lost() <-chan struct{} {
	if h := m.current(); h != nil {
		return h.lost
	}
	return notHeld
}

// HoldContext returns a context derived from parent that is cancelled
// when m's current hold ends, as Mutex.HoldContext's: context.Cause then
// says ErrLockLost (lost, the Lost channel closed) or ErrReleased (the
// last Unlock). Without a hold it is cancelled at once with ErrNotHeld.
// It carries the hold: a Lock with it re-enters it.
func (m *MultiMutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return holdContext(&m.mu, m, m.cur, parent)
}

// Do locks m, runs fn with a context of the hold, and unlocks that hold,
// as Mutex.Do.
func (m *MultiMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return do(ctx, m, &m.mu, m.Lock, m.Unlock, fn)
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

// newHold returns a hold of m for a call that takes the set: not m's yet
// (see commit), with a Mutex of its own for each name, whose hold's loss
// loses the set's.
func (m *MultiMutex) newHold() *hold {
	h := &hold{n: 1, lost: make(chan struct{})}
	for _, name := range m.names {
		l := m.c.newMutex(name, m.cfg)
		l.onLost = func() { m.partLost(h) } // called with l.mu held
		h.parts = append(h.parts, l)
	}
	return h
}

// reenter adds a level to h, m's hold that ctx carries, unless it has
// ended: it returns why then.
func (m *MultiMutex) reenter(ctx context.Context, h *hold) error {
	if err := m.c.usable(); err != nil {
		return err
	}
	return reenter(ctx, &m.mu, m, h)
}

// owed returns the channel that the Unlock owed to m's lost hold closes,
// or nil when no Unlock is owed. m.mu must be held.
func (m *MultiMutex) owed() <-chan struct{} {
	if m.cur != nil && m.cur.isLost {
		return m.free
	}
	return nil
}

// commit makes h, whose every name is held, m's hold, once m has no other
// (a hold of m found there, gone from Redis, is found lost soon). When
// that hold is lost (its Unlock is owed), or when it would wait and may
// not, it gives every name back and fails with errBusy. When a
// name's hold was lost meanwhile (a lease that ran out while the call
// waited for a later name), or the call gives up, it gives every name
// back and fails: with ErrLockLost, ctx's error or ErrClosed.
func (m *MultiMutex) commit(ctx context.Context, h *hold, wait bool) error {
	for {
		m.mu.Lock()
		if h.isLost {
			m.mu.Unlock()
			_ = m.giveBack(ctx, h.parts)
			return ErrLockLost
		}
		if m.cur == nil {
			m.cur, m.free = h, make(chan struct{})
			h.taken = time.Now()
			m.mu.Unlock()
			noteHold(ctx, m, h)
			return nil
		}
		owed, curLost, free := m.cur.isLost, m.cur.lost, m.free
		m.mu.Unlock()
		err := errBusy
		if wait && !owed {
			select {
			case <-free:
				continue
			case <-curLost: // its Unlock is owed now
				continue
			case <-h.lost:
				continue
			case <-ctx.Done():
				err = ctx.Err()
			case <-m.c.ctx.Done():
				err = ErrClosed
			}
		}
		_ = m.giveBack(ctx, h.parts)
		return err
	}
}

// partLost records that a name's hold was lost: so is the set's hold h,
// m's or a call's not committed yet. It is called by the name's Mutex
// with its mu held.
func (m *MultiMutex) partLost(h *hold) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h.isLost || h.cause != nil {
		return
	}
	h.isLost = true
	close(h.lost)
	end(h, ErrLockLost)
}

// giveBack releases the holds of locks, all at once, and returns their
// errors but ErrNotHeld (a name m does not hold has nothing to release).
// When ctx has ended (a Lock that gave up part-way), it waits for them at
// most roundtrip.CleanupWait after that: they go on in the background, no longer
// renewed.
func (m *MultiMutex) giveBack(ctx context.Context, locks []*Mutex) error {
	if roundtrip.Ended(ctx) != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), roundtrip.GraceEnd(ctx))
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

// usable checks, before any call to Redis, that m can be used now.
func (m *MultiMutex) usable(ctx context.Context) error {
	return cmp.Or(m.c.usable(), ctx.Err())
}

// label names m in errors and to an Observer: its names joined with "+".
func (m *MultiMutex) label() string { return strings.Join(m.names, "+") }

// call is how a call of m is told to an Observer.
func (m *MultiMutex) call(op Op) CallInfo {
	return CallInfo{Op: op, Primitive: PrimitiveMultiMutex, Name: m.label()}
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
