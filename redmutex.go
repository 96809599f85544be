package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redisync/redisync/internal/waiters"
)

// RedMutex is a lock held on a quorum of a Redlock's nodes. It has the
// core methods of Mutex (Lock, TryLock, Unlock, Token, Lost, HoldContext,
// Do, Extend and TTL), with the same meaning over a quorum of nodes, but
// not Handoff and Accept, which are Mutex's only. It is used as a Mutex
// is: a value excludes the goroutines that share it, each Lock call taking the
// lock on its own; it is reentrant through the hold's context (Do's,
// HoldContext's); Unlock may come from any goroutine; a lost hold stays
// the value's until its last Unlock. A value is safe for concurrent use.
//
// Each node holds the lock as a barging Mutex of the same name would (the
// same keys), under an owner of its own; the node's Client watchdog renews
// it. The lock is held while a quorum of these node holds is. A RedMutex
// is not fair: its waiters are not queued, and a free lock goes to the
// first to take a quorum (see NewMutex).
//
// Make a RedMutex with Redlock.NewMutex: every call of a zero RedMutex
// fails with ErrInvalid.
type RedMutex struct {
	r           *Redlock
	name        string
	cfg         config
	posts       []post // the nodes' channels, where a waiter waits
	lease       time.Duration
	nodeTimeout time.Duration
	recheck     time.Duration

	mu   sync.Mutex    // guards cur and the holds' fields; taken after a node's mu, never before
	cur  *hold         // the value's hold (n: the levels; parts: its node holds, nil where none), lost or not, until its last Unlock; nil: none
	free chan struct{} // closed when cur, the hold it was made for, is forgotten
}

// NewMutex returns a RedMutex for the lock called name on every node of r.
// It does no I/O. It fails with an *OpError wrapping ErrInvalidName or
// ErrInvalidOption (and ErrInvalid) for an invalid name or option.
func (r *Redlock) NewMutex(name string, opts ...Option) (*RedMutex, error) {
	cfg := with(r.cfg, atRedMutex, opts)
	if err := cmp.Or(checkName(name), cfg.err); err != nil {
		return nil, wrapOp("new redmutex", name, err)
	}
	// A RedMutex barges: independent nodes keep independent queues, which
	// may order the same waiters differently, so that each node would hand
	// its lock to another waiter and none reach a quorum. Ordering waiters
	// across nodes would take agreement among them, which Redlock does not
	// have (docs/design.md, "The fair lock").
	cfg.barging = true
	lease := cmp.Or(cfg.lease, cfg.watchdog)
	m := &RedMutex{
		r:           r,
		name:        name,
		cfg:         cfg,
		lease:       lease,
		nodeTimeout: cmp.Or(cfg.node, min(lease/10, defaultNodeTimeout)),
		recheck:     cfg.recheck,
	}
	for _, c := range r.clients {
		m.posts = append(m.posts, c.newMutex(name, cfg).post())
	}
	return m, nil
}

// Lock blocks until the lock is held for this call on a quorum of nodes,
// ctx ends or the Redlock is closed. When ctx carries m's hold (Do's,
// HoldContext's), Lock re-enters it at once, with no call to Redis (and,
// under WithFixedLease, without re-arming the lease).
//
// Each round tries every node at once, each for at most the node timeout
// (WithNodeTimeout). It wins when a quorum granted the lock and raised its
// fencing token (see Token) before the lease, less the time the round took
// and a drift margin (1% + 2 ms), ran out. A round that did not win releases
// whatever it took, on every node. A waiter then sleeps until a release is
// announced on any node (each node's Client subscriber), and no longer than
// the shortest remaining lease seen or the recheck interval; after a round
// in which contenders split the nodes, it pauses a short random time.
//
// Lock returns an error wrapping ErrQuorum as soon as a round finds fewer
// than a quorum of nodes answering: a lock that cannot be taken is not
// waited for. It returns ErrClosed after Close, and ctx.Err() wrapped when
// ctx ends first; it leaves nothing behind then.
func (m *RedMutex) Lock(ctx context.Context) error {
	return observed(m.r.observer(), ctx, CallInfo{Op: OpLock, Primitive: PrimitiveRedMutex, Name: m.name}, m.lock, m.Token)
}

// lock is Lock, unobserved.
func (m *RedMutex) lock(ctx context.Context) error {
	if h := holdIn(ctx, m); h != nil {
		return m.wrapIf("lock", m.reenter(ctx, h))
	}
	if err := m.r.usable(); err != nil {
		return m.wrap("lock", err)
	}
	if err := owedUnlock(ctx, &m.mu, m.owed, m.r.clients[0].ctx.Done(), true); err != nil {
		return m.wrap("lock", err)
	}
	// The call's address is a ticket of its own, which no grant names:
	// its node attempts tell its waiters from other plain waiters.
	if err := block(ctx, m.posts, m.newCall(m.r.clients[0].ticket(""))); err != nil {
		return m.wrap("lock", err)
	}
	return nil
}

// owed returns the channel that the Unlock owed to m's lost hold closes,
// or nil when no Unlock is owed. m.mu must be held.
func (m *RedMutex) owed() <-chan struct{} {
	if m.cur != nil && m.cur.isLost {
		return m.free
	}
	return nil
}

// TryLock makes one round and never waits: it reports whether the lock
// is held for this call now (false while another goroutine of m holds
// it). When ctx carries m's hold, it re-enters it, as Lock does. When
// fewer than a quorum of nodes answered, it returns false and an error
// wrapping ErrQuorum.
func (m *RedMutex) TryLock(ctx context.Context) (bool, error) {
	return observedTry(m.r.observer(), ctx, CallInfo{Op: OpTryLock, Primitive: PrimitiveRedMutex, Name: m.name}, m.tryLock, m.Token)
}

// tryLock is TryLock, unobserved.
func (m *RedMutex) tryLock(ctx context.Context) (bool, error) {
	if h := holdIn(ctx, m); h != nil {
		err := m.reenter(ctx, h)
		return err == nil, m.wrapIf("trylock", err)
	}
	if err := m.r.usable(); err != nil {
		return false, m.wrap("trylock", err)
	}
	if owedUnlock(ctx, &m.mu, m.owed, m.r.clients[0].ctx.Done(), false) != nil {
		return false, nil // a lost hold of m still owes its Unlock
	}
	acquired, _, _, err := m.newCall("").round(ctx)
	if err != nil {
		return false, m.wrap("trylock", err)
	}
	return acquired, nil
}

// Unlock releases one level of m's hold: of the hold ctx carries (see
// Lock), or else of the value's hold, whichever goroutine took it. The
// last level releases the lock on every node of the hold, at once. It
// returns ErrNotHeld when m holds nothing, ErrLockLost when the hold had
// been lost (Lost was closed, or fewer than a quorum of nodes still had
// their hold to release: the lock may have had another owner meanwhile),
// and an error wrapping ErrQuorum when more than N - quorum nodes could
// not be told: their holds then stay until their leases run out. m
// forgets the hold in every case.
func (m *RedMutex) Unlock(ctx context.Context) error {
	return observed(m.r.observer(), ctx, CallInfo{Op: OpUnlock, Primitive: PrimitiveRedMutex, Name: m.name}, m.unlock, nil)
}

// unlock is Unlock, unobserved.
func (m *RedMutex) unlock(ctx context.Context) error {
	if err := m.r.usable(); err != nil {
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
	if h == nil {
		m.mu.Unlock()
		return m.wrap("unlock", ErrNotHeld)
	}
	lost := h.isLost
	if h.n > 1 {
		h.n--
		m.mu.Unlock()
		if lost {
			return m.wrap("unlock", ErrLockLost)
		}
		return nil
	}
	token, taken := h.token, h.taken // how it ended is told below
	end(h, ErrReleased)              // a lost hold ended already, as lost
	if m.cur == h {
		m.cur = nil
		close(m.free)
	}
	m.mu.Unlock()

	x := &redCall{m: m, nodes: h.parts, busy: make([]int, len(h.parts))}
	members := make([]bool, len(h.parts))
	for i, n := range h.parts {
		members[i] = n != nil
	}
	res := x.fanOut(context.WithoutCancel(ctx), members, x.releaseOn, m.quorumOK, nil)
	released, failed := 0, &NodeErrors{}
	for i, r := range res {
		switch {
		case !members[i]:
		case !r.done || r.err != nil:
			failed.Nodes = append(failed.Nodes, nodeError(i, r))
		case r.ok:
			released++
		}
	}
	unknown := len(failed.Nodes) > len(h.parts)-m.r.quorum
	if !lost { // a lost hold was told already
		kind := EventHoldReleased
		if !unknown && released < m.r.quorum {
			kind = EventHoldLost // found gone: lost, not released
		}
		m.emitHold(kind, token, taken, nil)
	}
	switch {
	case unknown:
		return m.wrap("unlock", fmt.Errorf("%w: %d of %d nodes not released: %w",
			ErrQuorum, len(failed.Nodes), len(h.parts), failed))
	case lost || released < m.r.quorum:
		// Too many node holds were gone: another owner may have
		// held the lock meanwhile, before the watchdog could tell.
		return m.wrap("unlock", ErrLockLost)
	}
	return nil
}

// Token returns the fencing token of m's current hold, or 0 when m does not
// hold the lock. It is the largest of the tokens that the quorum's nodes
// minted for the hold; before Lock returned, every node of the hold had
// its token counter raised to it (while still held there).
//
// So, as long as no node loses its counter (a restart without persistence,
// a failover to a replica that had not received it), any two holds share a
// node (two majorities intersect) and the one that took that node later has
// the larger token: tokens increase from one hold to the next, even when a
// node's key expired early (a clock jump) and two holders overlap. A
// resource that rejects tokens lower than the highest it has seen then
// rejects the stale holder's writes once the newer holder has written. It
// cannot reject the stale writes that come first, and nothing protects a
// resource that does not check. Re-entering does not mint a token.
func (m *RedMutex) Token() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == nil {
		return 0
	}
	return m.cur.token
}

// Lost returns a channel that is closed when m's current hold is lost:
// fewer than a quorum of its node holds remain, the others having been
// lost each by its node's watchdog (by the local deadline of its lease, or
// when a renewal found it gone), or the Redlock was closed. A hold that
// lost a node does not get it back. A normal Unlock does not close it.
// When m holds nothing, Lost returns a closed channel: take it after Lock
// succeeds.
func (m *RedMutex) Lost() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == nil {
		return notHeld
	}
	return m.cur.lost
}

// HoldContext returns a context derived from parent that is cancelled
// when m's current hold ends, as Mutex.HoldContext's: context.Cause then
// says ErrLockLost (lost, the Lost channel closed), or ErrReleased (the
// last Unlock). Without a hold it is cancelled at once with ErrNotHeld.
// It carries the hold: a Lock with it re-enters it.
func (m *RedMutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return holdContext(&m.mu, m, m.cur, parent)
}

// Do locks m, runs fn with a context of the hold, and unlocks that hold,
// as Mutex.Do.
func (m *RedMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return do(ctx, m, &m.mu, m.Lock, m.Unlock, fn)
}

// Name returns the name of the lock.
func (m *RedMutex) Name() string { return m.name }

// reenter adds a level to h, m's hold that ctx carries, unless it has
// ended: it returns why then.
func (m *RedMutex) reenter(ctx context.Context, h *hold) error {
	if err := m.r.usable(); err != nil {
		return err
	}
	return reenter(ctx, &m.mu, m, h)
}

// commit makes h, which holds the lock on the nodes of x in held with the
// fencing token token, m's hold, once m has no other (a hold of m found
// there, gone from the nodes, is found lost soon). When that hold is lost
// (its Unlock is owed), or when it would wait and may not (wait false), it
// fails with errBusy: the caller gives the node holds back. It fails
// with ErrLockLost when fewer than a quorum of the node holds are left
// (lost while it waited), ctx's error when ctx ends first, and ErrClosed.
func (m *RedMutex) commit(ctx context.Context, x *redCall, held []int, token int64, wait bool) error {
	h := x.h
	m.mu.Lock()
	h.token, h.parts = token, make([]*Mutex, len(x.nodes))
	for _, i := range held {
		h.parts[i] = x.nodes[i]
	}
	h.alive = len(held)
	m.mu.Unlock()
	// A node hold lost before it was a part was not counted.
	for _, i := range held {
		if isClosed(x.nodes[i].Lost()) {
			m.nodeLost(h, i)
		}
	}
	for {
		m.mu.Lock()
		if h.isLost {
			m.mu.Unlock()
			return ErrLockLost
		}
		if m.cur == nil {
			m.cur, m.free = h, make(chan struct{})
			h.taken = time.Now()
			m.emit(EventHoldTaken, nil)
			m.mu.Unlock()
			noteHold(ctx, m, h)
			return nil
		}
		owed, curLost, free := m.cur.isLost, m.cur.lost, m.free
		m.mu.Unlock()
		if owed || !wait {
			return errBusy
		}
		select {
		case <-free:
		case <-curLost: // its Unlock is owed now
		case <-h.lost:
		case <-ctx.Done():
			return ctx.Err()
		case <-x.closed():
			return ErrClosed
		}
	}
}

// nodeLost records that node i's hold of h was lost. It is called by the
// node Mutex with its mu held.
func (m *RedMutex) nodeLost(h *hold, i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h.parts == nil || h.parts[i] == nil || h.isLost || h.cause != nil {
		return // not a part yet (see commit), or ended
	}
	if h.alive--; h.alive >= m.r.quorum {
		return
	}
	h.isLost = true
	close(h.lost)
	end(h, ErrLockLost)
	if m.cur != h {
		return // never m's: nothing to tell
	}
	if m.r.usable() == ErrClosed {
		m.emit(EventHoldReleased, ErrClosed) // Close releases it
	} else {
		m.emit(EventHoldLost, nil)
	}
}

// emit tells the first node's events queue that the current hold was
// taken or ended. m.mu must be held.
func (m *RedMutex) emit(kind EventKind, err error) {
	m.emitHold(kind, m.cur.token, m.cur.taken, err)
}

// emitHold tells the first node's events queue that the hold with token,
// taken at taken, was taken or ended.
func (m *RedMutex) emitHold(kind EventKind, token int64, taken time.Time, err error) {
	if m.r.clients[0].events == nil {
		return
	}
	ev := m.r.clients[0].events
	e := Event{Kind: kind, Primitive: PrimitiveRedMutex, Name: m.name, Token: token, Err: err}
	if kind != EventHoldTaken {
		e.Held = time.Since(taken)
	}
	ev.emit(e)
}

// wrapIf adds the operation and the lock name to err, if not nil.
func (m *RedMutex) wrapIf(op string, err error) error { return m.wrap(op, err) }

// wrap adds the operation and the lock name to err; nil stays nil.
func (m *RedMutex) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) && oe.Name == m.name && oe.Op == "redlock "+op {
		return err
	}
	return &OpError{Op: "redlock " + op, Name: m.name, Err: err}
}

// redCall is one Lock or TryLock call of a RedMutex: it makes rounds
// until one wins, with a Mutex of its own on each node, and the hold it
// makes m's once a round wins. As the wait loop (block) sees a Lock, it
// has no queue and no grant to adopt: a release on any node wakes it to
// make another round. Its waiters are registered under addr.
type redCall struct {
	m     *RedMutex
	addr  string
	h     *hold    // the hold a round that wins makes m's
	nodes []*Mutex // the call's Mutex on each node
	mu    sync.Mutex
	busy  []int // calls to the node still running
}

// newCall returns a call of m whose waiters are registered under addr (""
// for a TryLock, which does not wait).
func (m *RedMutex) newCall(addr string) *redCall {
	x := &redCall{m: m, addr: addr, h: &hold{n: 1, lost: make(chan struct{})}, busy: make([]int, len(m.r.clients))}
	for i, c := range m.r.clients {
		nm := c.newMutex(m.name, m.cfg)
		nm.onLost = func() { m.nodeLost(x.h, i) } // called with nm.mu held
		nm.quiet = true                           // m tells its own holds
		x.nodes = append(x.nodes, nm)
	}
	return x
}

// attempt makes a round. After a round in which the call took some nodes
// but not a quorum (contenders split the nodes between them, or another
// owner holds a bare quorum), it pauses a short random time, so that the
// contenders do not meet again at once, rather than be woken at once by
// its own releases.
func (x *redCall) attempt(ctx context.Context) (bool, time.Duration, error) {
	acquired, sleep, split, err := x.round(ctx)
	if err != nil || acquired || !split {
		return acquired, sleep, err
	}
	return false, sleep, x.m.pause(ctx, rand.N(min(x.m.nodeTimeout, maxSplitJitter))+time.Millisecond)
}

// outlasts: a round that finds too few nodes answering ends the call; a
// lock that a majority cannot grant is not waited for.
func (*redCall) outlasts(error) bool { return false }

func (*redCall) sleeping(*waiters.Set)                       {}
func (*redCall) adopt(context.Context, string) (bool, error) { return false, nil }
func (x *redCall) address() string                           { return x.addr }
func (*redCall) finish(context.Context, error)               {}

// closed returns a channel closed when the Redlock is closed.
func (x *redCall) closed() <-chan struct{} { return x.m.r.clients[0].ctx.Done() }

// pause sleeps for d, or until ctx ends or the Redlock is closed.
func (m *RedMutex) pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return m.r.usable()
	case <-ctx.Done():
		return ctx.Err()
	}
}
