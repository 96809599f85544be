package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// RedMutex is a reentrant lock held on a quorum of a Redlock's nodes. It
// has the methods of Mutex, with the same meaning, and is used the same
// way: a value is one owner (Lock on a value that holds the lock re-enters
// it, and only the last Unlock releases it); give each goroutine that must
// be excluded its own value. A value is safe for concurrent use.
//
// Each node holds the lock as a barging Mutex of the same name would (the
// same keys), under an owner of its own; the node's Client watchdog renews
// it. The lock is held while a quorum of these node holds is. A RedMutex
// is not fair: its waiters are not queued, and a free lock goes to the
// first to take a quorum (see NewMutex).
type RedMutex struct {
	r           *Redlock
	name        string
	nodes       []*Mutex // one per node, in the order of the Redlock's
	posts       []post   // the nodes' channels, where a waiter waits
	lease       time.Duration
	nodeTimeout time.Duration
	recheck     time.Duration
	err         error

	op turn // held by the call of this value that talks to Redis

	mu     sync.Mutex // guards the fields below; taken after a node's mu, never before
	cur    *hold      // the current hold (its n: the levels re-entered); nil: none
	member []bool     // the node is part of the current hold
	alive  []bool     // ... and its node hold is not known lost
	nAlive int
	busy   []int // calls to the node still running
}

// NewMutex returns a RedMutex for the lock called name on every node of r.
// It does no I/O; bad input (ErrInvalidName, ErrInvalidOption, or the
// Redlock's own) is reported by every call, before any call to Redis.
func (r *Redlock) NewMutex(name string, opts ...RedMutexOption) *RedMutex {
	cfg := with(r.cfg, opts, RedMutexOption.applyRedMutex)
	// A RedMutex barges: independent nodes keep independent queues, which
	// may order the same waiters differently, so that each node would hand
	// its lock to another waiter and none reach a quorum. Ordering waiters
	// across nodes would take agreement among them, which Redlock does not
	// have (docs/design.md, "The fair lock").
	cfg.barging = true
	lease := cmp.Or(cfg.lease, cfg.watchdog)
	n := len(r.clients)
	m := &RedMutex{
		r:           r,
		name:        name,
		lease:       lease,
		nodeTimeout: cmp.Or(cfg.node, min(lease/10, defaultNodeTimeout)),
		recheck:     cfg.recheck,
		err:         cmp.Or(checkName(name), cfg.err),
		op:          newTurn(),
		member:      make([]bool, n),
		alive:       make([]bool, n),
		busy:        make([]int, n),
	}
	for i, c := range r.clients {
		nm := c.newMutex(name, cfg)
		nm.onLost = func() { m.nodeLost(i) }
		nm.quiet = true // m tells its own holds
		m.nodes = append(m.nodes, nm)
		m.posts = append(m.posts, nm.post())
	}
	return m
}

// Lock blocks until m holds the lock on a quorum of nodes, ctx ends or the
// Redlock is closed. If m already holds it, Lock re-enters at once, with no
// call to Redis (and, under WithLease, without re-arming the lease).
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
// waited for. When m's hold was lost, Lock drops it (its Lost channel
// stays closed, and the Unlocks it was owed are not owed any more),
// releases its node holds left and takes the lock anew. It returns
// ErrClosed after Close, and ctx.Err() wrapped when ctx ends first; it
// leaves nothing behind then.
func (m *RedMutex) Lock(ctx context.Context) error {
	return observed(m.r.cfg.obs, ctx, Call{Op: OpLock, Primitive: PrimitiveRedMutex, Name: m.name}, m.lock, m.Token)
}

// lock is Lock, unobserved.
func (m *RedMutex) lock(ctx context.Context) error {
	// The call's address is a ticket of its own, which no grant names:
	// its node attempts tell its waiters from other plain waiters.
	if err := block(ctx, m.posts, redCall{m: m, addr: m.nodes[0].c.ticket("")}); err != nil {
		return m.wrap("lock", err)
	}
	return nil
}

// TryLock makes one round and never waits: it reports whether m holds the
// lock now (re-entering if it already did; taking it anew if m's hold was
// lost, as Lock does). When fewer than a quorum of
// nodes answered, it returns false and an error wrapping ErrQuorum.
func (m *RedMutex) TryLock(ctx context.Context) (bool, error) {
	return observedTry(m.r.cfg.obs, ctx, Call{Op: OpTryLock, Primitive: PrimitiveRedMutex, Name: m.name}, m.tryLock, m.Token)
}

// tryLock is TryLock, unobserved.
func (m *RedMutex) tryLock(ctx context.Context) (bool, error) {
	acquired, _, _, err := m.round(ctx, "")
	if err != nil {
		return false, m.wrap("trylock", err)
	}
	return acquired, nil
}

// Unlock releases one level of m's hold; the last level releases the lock
// on every node of the hold, at once. It returns ErrNotHeld when m holds
// nothing, ErrLockLost when the hold had been lost (Lost was closed, or
// fewer than a quorum of nodes still had their hold to release: the lock
// may have had another owner meanwhile), and an
// error wrapping ErrQuorum when more than N - quorum nodes could not be
// told: their holds then stay until their leases run out. m forgets the
// hold in every case.
func (m *RedMutex) Unlock(ctx context.Context) error {
	return observed(m.r.cfg.obs, ctx, Call{Op: OpUnlock, Primitive: PrimitiveRedMutex, Name: m.name}, m.unlock, nil)
}

// unlock is Unlock, unobserved.
func (m *RedMutex) unlock(ctx context.Context) error {
	if err := m.begin(ctx); err != nil {
		return m.wrap("unlock", err)
	}
	defer m.end()

	m.mu.Lock()
	h := m.cur
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
	members := slices.Clone(m.member)
	if !lost {
		end(h, ErrReleased)
	}
	token, taken := h.token, h.taken // how it ended is told below
	m.forget()
	m.mu.Unlock()

	res := m.fanOut(context.WithoutCancel(ctx), members, m.releaseOn, m.quorumOK, nil)
	released, failed := 0, &NodeErrors{}
	for i, x := range res {
		switch {
		case !members[i]:
		case !x.done || x.err != nil:
			failed.Nodes = append(failed.Nodes, nodeError(i, x))
		case x.ok:
			released++
		}
	}
	unknown := len(failed.Nodes) > len(m.nodes)-m.r.quorum
	if !lost { // a lost hold was told already
		kind := KindHoldReleased
		if !unknown && released < m.r.quorum {
			kind = KindHoldLost // found gone: lost, not released
		}
		m.emitHold(kind, token, taken, nil)
	}
	switch {
	case unknown:
		return m.wrap("unlock", fmt.Errorf("%w: %d of %d nodes not released: %w",
			ErrQuorum, len(failed.Nodes), len(m.nodes), failed))
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
// When m holds nothing, Lost returns nil.
func (m *RedMutex) Lost() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == nil {
		return nil
	}
	return m.cur.lost
}

// HoldContext returns a context derived from parent that is cancelled
// when m's current hold ends, as Mutex.HoldContext's: context.Cause then
// says ErrLockLost (lost, the Lost channel closed), or ErrReleased (the
// last Unlock). Without a hold it is cancelled at once with ErrNotHeld.
func (m *RedMutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return holdContext(&m.mu, m.cur, parent)
}

// Do locks m, runs fn with m's HoldContext, and unlocks m, as Mutex.Do.
func (m *RedMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return do(ctx, &m.mu, &m.cur, m.Lock, m.Unlock, fn)
}

// Name returns the name of the lock.
func (m *RedMutex) Name() string { return m.name }

// commit records a new hold on the nodes held, with its token, and
// returns it.
func (m *RedMutex) commit(held []int, token int64) *hold {
	m.mu.Lock()
	m.forget()
	h := &hold{token: token, n: 1, lost: make(chan struct{}), taken: time.Now()}
	m.cur = h
	for _, i := range held {
		m.member[i], m.alive[i] = true, true
	}
	m.nAlive = len(held)
	m.emit(KindHoldTaken, nil)
	m.mu.Unlock()
	// A node hold lost before the commit was ignored by nodeLost.
	for _, i := range held {
		select {
		case <-m.nodes[i].Lost():
			m.nodeLost(i)
		default:
		}
	}
	return h
}

// forget clears the current hold. m.mu must be held.
func (m *RedMutex) forget() {
	if m.cur != nil {
		end(m.cur, ErrReleased) // a lost hold ended already, as lost
	}
	m.cur, m.nAlive = nil, 0
	clear(m.member)
	clear(m.alive)
}

// nodeLost records that node i's hold was lost. It is called by the node
// Mutex with its mu held.
func (m *RedMutex) nodeLost(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.alive[i] {
		return
	}
	m.alive[i] = false
	m.nAlive--
	if h := m.cur; h != nil && m.nAlive < m.r.quorum && !h.isLost {
		h.isLost = true
		close(h.lost)
		end(h, ErrLockLost)
		if m.r.usable() == ErrClosed {
			m.emit(KindHoldReleased, ErrClosed) // Close releases it
		} else {
			m.emit(KindHoldLost, nil)
		}
	}
}

// emit tells the first node's events queue that the current hold was
// taken or ended. m.mu must be held.
func (m *RedMutex) emit(kind Kind, err error) {
	m.emitHold(kind, m.cur.token, m.cur.taken, err)
}

// emitHold tells the first node's events queue that the hold with token,
// taken at taken, was taken or ended.
func (m *RedMutex) emitHold(kind Kind, token int64, taken time.Time, err error) {
	if m.r.clients[0].events == nil {
		return
	}
	ev := m.r.clients[0].events
	e := Event{Kind: kind, Primitive: PrimitiveRedMutex, Name: m.name, Token: token, Err: err}
	if kind != KindHoldTaken {
		e.Held = time.Since(taken)
	}
	ev.emit(e)
}

// begin checks that m can be used and takes m's turn to talk to Redis.
func (m *RedMutex) begin(ctx context.Context) error {
	if m.err != nil {
		return m.err
	}
	if err := m.r.usable(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return m.op.take(ctx, nil)
}

// end gives back m's turn to talk to Redis.
func (m *RedMutex) end() { m.op.give() }

// wrap adds the operation and the lock name to err.
func (m *RedMutex) wrap(op string, err error) error {
	var oe *opError
	if errors.As(err, &oe) && oe.name == m.name && oe.op == "redlock "+op {
		return err
	}
	return &opError{op: "redlock " + op, name: m.name, err: err}
}

// redCall is a RedMutex.Lock call as the wait loop (block) sees it: it
// makes rounds until one wins. It has no queue and no grant to adopt: a
// release on any node wakes it to make another round. Its waiters are
// registered under addr.
type redCall struct {
	m    *RedMutex
	addr string
}

// attempt makes a round. After a round in which m took some nodes but not
// a quorum (contenders split the nodes between them), it pauses a short
// random time, so that the contenders do not meet again at once, rather
// than be woken at once by its own releases.
func (x redCall) attempt(ctx context.Context) (bool, time.Duration, error) {
	acquired, sleep, split, err := x.m.round(ctx, x.addr)
	if err != nil || acquired || !split {
		return acquired, sleep, err
	}
	return false, 0, x.m.pause(ctx, rand.N(min(x.m.nodeTimeout, maxSplitJitter))+time.Millisecond)
}

// outlasts: a round that finds too few nodes answering ends the call; a
// lock that a majority cannot grant is not waited for.
func (redCall) outlasts(error) bool { return false }

func (redCall) sleeping(*waitSet)                           {}
func (redCall) adopt(context.Context, string) (bool, error) { return false, nil }
func (redCall) changed() <-chan struct{}                    { return nil }
func (x redCall) address() string                           { return x.addr }
func (redCall) finish(context.Context, error)               {}

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
