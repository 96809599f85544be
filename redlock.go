package redisync

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/redlock_raise.lua
	luaRedlockRaise string

	redlockRaiseScript = redis.NewScript(luaLib + luaRedlockRaise)
)

// Timing of a Redlock.
const (
	// defaultNodeTimeout caps the default per-node timeout (a tenth of
	// the lease).
	defaultNodeTimeout = 500 * time.Millisecond
	// maxSplitJitter caps the random pause after a round in which
	// contenders split the nodes between them and nobody won.
	maxSplitJitter = 50 * time.Millisecond
	// minGrace is the least time the slower nodes of a round are given
	// once its outcome is known, for scheduling noise.
	minGrace = 5 * time.Millisecond
)

// Redlock takes locks on N independent Redis deployments ("nodes") at
// once, after the Redlock algorithm: a lock is held when a majority of the
// nodes (the quorum, N/2+1) granted it within the lease. It keeps working
// while fewer than N - quorum + 1 nodes are down, slow or wiped. See
// docs/deployment.md for what this buys and what it does not.
//
// A Redlock owns one Client per node (a subscriber and a watchdog each),
// created with the options given to NewRedlock. It is safe for concurrent
// use. Close it when done.
type Redlock struct {
	clients []*Client
	quorum  int
	cfg     config
	err     error // invalid nodes or option

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup // calls to nodes still running, possibly abandoned
}

// NewRedlock returns a Redlock over the nodes rdbs, each a client of an
// independent Redis deployment (the Redlock never closes them). The options
// become the defaults of every lock of the Redlock; Fair is not supported.
// NewRedlock does no I/O. Bad input is reported by every later call, before
// any call to Redis: no nodes or a nil one (ErrNilClient), the same node
// twice (ErrDuplicateNode: the same client value, or two *redis.Client with
// the same address and database), an invalid option (ErrInvalidOption).
//
// An even number of nodes is accepted, but tolerates no more failures than
// one node fewer: 4 nodes need 3, like 5; 2 nodes need both.
func NewRedlock(rdbs []redis.UniversalClient, opts ...Option) *Redlock {
	r := &Redlock{cfg: defaultConfig().with(opts), quorum: len(rdbs)/2 + 1}
	r.err = cmp.Or(checkNodes(rdbs), r.cfg.err, checkRedlockConfig(r.cfg))
	if r.err == nil {
		for _, rdb := range rdbs {
			r.clients = append(r.clients, New(rdb, opts...))
		}
	}
	return r
}

// Close closes the Redlock's Clients (see Client.Close: every hold is
// lost, its Lost channel closed, and released on its node), and waits for
// calls to nodes still running, including those a lock gave up waiting for,
// to return. It is idempotent and always returns nil.
func (r *Redlock) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	for _, c := range r.clients {
		_ = c.Close()
	}
	r.calls.Wait()
	return nil
}

// Quorum returns how many nodes must grant a lock: a majority.
func (r *Redlock) Quorum() int { return r.quorum }

// usable reports why the Redlock cannot be used, if it cannot.
func (r *Redlock) usable() error {
	if r.err != nil {
		return r.err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	return nil
}

// goCall runs f in a goroutine that Close waits for, unless the Redlock is
// closed.
func (r *Redlock) goCall(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.calls.Add(1)
	go func() {
		defer r.calls.Done()
		f()
	}()
	return true
}

// checkNodes validates NewRedlock's nodes.
func checkNodes(rdbs []redis.UniversalClient) error {
	if len(rdbs) == 0 {
		return fmt.Errorf("%w: a redlock needs at least one node", ErrNilClient)
	}
	seen := make(map[any]int)
	for i, rdb := range rdbs {
		v := reflect.ValueOf(rdb)
		if rdb == nil || (v.Kind() == reflect.Pointer && v.IsNil()) {
			return fmt.Errorf("%w: redlock node %d", ErrNilClient, i)
		}
		var key any = rdb
		if c, ok := rdb.(*redis.Client); ok {
			o := c.Options()
			key = fmt.Sprintf("%s|%s|%d", o.Network, o.Addr, o.DB)
		} else if !v.Type().Comparable() {
			continue
		}
		if j, ok := seen[key]; ok {
			return fmt.Errorf("%w: nodes %d and %d are the same", ErrDuplicateNode, j, i)
		}
		seen[key] = i
	}
	return nil
}

// checkRedlockConfig rejects the options a Redlock does not support.
func checkRedlockConfig(cfg config) error {
	if cfg.fair {
		return fmt.Errorf("%w: a redlock cannot be fair", ErrInvalidOption)
	}
	return nil
}

// WithNodeTimeout sets how long a Redlock waits for one node's reply before
// it counts the node as failed for this round (the call goes on in the
// background, and whatever it did is undone when it returns). It should be
// small next to the lease: the time a round takes is taken off the lock's
// validity. d must be in [1ms, MaxLease]. Only a Redlock uses it.
//
// The default is a tenth of the lease, at most 500 ms.
func WithNodeTimeout(d time.Duration) Option {
	return func(cfg *config) {
		if cfg.checkDuration("node timeout", d) {
			cfg.node = d
		}
	}
}

// RedMutex is a reentrant lock held on a quorum of a Redlock's nodes. It
// has the methods of Mutex, with the same meaning, and is used the same
// way: a value is one owner (Lock on a value that holds the lock re-enters
// it, and only the last Unlock releases it); give each goroutine that must
// be excluded its own value. A value is safe for concurrent use.
//
// Each node holds the lock as a plain Mutex of the same name would (the
// same keys), under an owner of its own; the node's Client watchdog renews
// it. The lock is held while a quorum of these node holds is.
type RedMutex struct {
	r           *Redlock
	name        string
	nodes       []*Mutex // one per node, in the order of the Redlock's
	lease       time.Duration
	nodeTimeout time.Duration
	recheck     time.Duration
	err         error

	op chan struct{} // held by the call of this value that talks to Redis

	mu     sync.Mutex // guards the fields below; taken after a node's mu, never before
	count  int64      // hold count; 0: not held
	token  int64
	lost   chan struct{}
	isLost bool
	taken  time.Time // when the current hold was taken, for events
	member []bool    // the node is part of the current hold
	alive  []bool    // ... and its node hold is not known lost
	nAlive int
	busy   []int // calls to the node still running
}

// NewMutex returns a RedMutex for the lock called name on every node of r.
// It does no I/O; bad input (ErrInvalidName, ErrInvalidOption, or the
// Redlock's own) is reported by every call, before any call to Redis.
func (r *Redlock) NewMutex(name string, opts ...Option) *RedMutex {
	cfg := r.cfg.with(opts)
	lease := cmp.Or(cfg.lease, cfg.watchdog)
	n := len(r.clients)
	m := &RedMutex{
		r:           r,
		name:        name,
		lease:       lease,
		nodeTimeout: cmp.Or(cfg.node, min(lease/10, defaultNodeTimeout)),
		recheck:     cfg.recheck,
		err:         cmp.Or(r.err, checkName(name), cfg.err, checkRedlockConfig(cfg)),
		op:          make(chan struct{}, 1),
		member:      make([]bool, n),
		alive:       make([]bool, n),
		busy:        make([]int, n),
	}
	for i, c := range r.clients {
		nm := c.NewMutex(name, opts...)
		nm.onLost = func() { m.nodeLost(i) }
		nm.quiet = true // m tells its own holds
		m.nodes = append(m.nodes, nm)
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
	if m.r.cfg.obs == nil {
		return m.lock(ctx)
	}
	ctx, o := observe(m.r.cfg.obs, ctx, OpLock, PrimitiveRedMutex, m.name, 0)
	err := m.lock(ctx)
	o.end(ctx, true, err, m.Token())
	return err
}

// lock is Lock, unobserved.
func (m *RedMutex) lock(ctx context.Context) (err error) {
	var ws []*waiter    // one per node, registered on the lock's channel
	var woken []*waiter // took a wake-up that no round has used yet
	defer func() {
		if err != nil {
			for _, w := range woken {
				w.nudge() // leave passes it on
			}
		}
		leaveAll(ws)
		if err != nil {
			err = m.wrap("lock", err)
		}
	}()
	ws = m.joinConfirmed()
	for {
		acquired, sleep, split, err := m.round(ctx)
		if err != nil || acquired {
			return err
		}
		woken = nil
		if ws == nil {
			// Subscribe, then look again: a release between the
			// round above and the subscriptions would be missed.
			if ws, err = m.join(ctx); err != nil {
				return err
			}
			continue
		}
		if split {
			// Our own releases just published: desynchronise from
			// the other contenders instead.
			err = m.pause(ctx, rand.N(min(m.nodeTimeout, maxSplitJitter))+time.Millisecond)
		} else {
			woken, err = m.waitAny(ctx, ws, sleep)
		}
		if err != nil {
			return err
		}
	}
}

// TryLock makes one round and never waits: it reports whether m holds the
// lock now (re-entering if it already did; taking it anew if m's hold was
// lost, as Lock does). When fewer than a quorum of
// nodes answered, it returns false and an error wrapping ErrQuorum.
func (m *RedMutex) TryLock(ctx context.Context) (bool, error) {
	if m.r.cfg.obs == nil {
		return m.tryLock(ctx)
	}
	ctx, o := observe(m.r.cfg.obs, ctx, OpTryLock, PrimitiveRedMutex, m.name, 0)
	ok, err := m.tryLock(ctx)
	o.end(ctx, ok, err, m.Token())
	return ok, err
}

// tryLock is TryLock, unobserved.
func (m *RedMutex) tryLock(ctx context.Context) (bool, error) {
	acquired, _, _, err := m.round(ctx)
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
	if m.r.cfg.obs == nil {
		return m.unlock(ctx)
	}
	ctx, o := observe(m.r.cfg.obs, ctx, OpUnlock, PrimitiveRedMutex, m.name, 0)
	err := m.unlock(ctx)
	o.end(ctx, true, err, 0)
	return err
}

// unlock is Unlock, unobserved.
func (m *RedMutex) unlock(ctx context.Context) error {
	if err := m.begin(ctx); err != nil {
		return m.wrap("unlock", err)
	}
	defer m.end()

	m.mu.Lock()
	if m.count == 0 {
		m.mu.Unlock()
		return m.wrap("unlock", ErrNotHeld)
	}
	lost := m.isLost
	if m.count > 1 {
		m.count--
		m.mu.Unlock()
		if lost {
			return m.wrap("unlock", ErrLockLost)
		}
		return nil
	}
	members := slices.Clone(m.member)
	if !lost {
		m.emit(KindHoldReleased, nil)
	}
	m.forget()
	m.mu.Unlock()

	res := m.fanOut(context.WithoutCancel(ctx), members, m.releaseOn, m.quorumOK, nil)
	released, failed, errs := 0, 0, []error(nil)
	for i, x := range res {
		switch {
		case !members[i]:
		case !x.done || x.err != nil:
			failed++
			errs = append(errs, nodeErr(i, x))
		case x.ok:
			released++
		}
	}
	switch {
	case failed > len(m.nodes)-m.r.quorum:
		return m.wrap("unlock", fmt.Errorf("%w: %d of %d nodes not released: %w",
			ErrQuorum, failed, len(m.nodes), nodeErrors(errs)))
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
	return m.token
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
	return m.lost
}

// Name returns the name of the lock.
func (m *RedMutex) Name() string { return m.name }

// nodeResult is what one node's call of a round returned.
type nodeResult struct {
	done  bool // answered before the round gave up on it
	ok    bool // granted, raised or released
	token int64
	pttl  int64
	err   error
}

// round makes one attempt on every node and keeps the lock if a quorum
// granted it in time. It reports whether m holds the lock now and, when not,
// how long to sleep at most and whether m had taken some nodes (a split).
// It returns an error wrapping ErrQuorum when fewer than a quorum answered.
func (m *RedMutex) round(ctx context.Context) (acquired bool, sleep time.Duration, split bool, err error) {
	if err := m.begin(ctx); err != nil {
		return false, 0, false, err
	}
	defer m.end()
	m.mu.Lock()
	if m.count > 0 && !m.isLost {
		m.count++
		m.mu.Unlock()
		return true, 0, false, nil
	}
	var stale []int
	if m.count > 0 {
		// The hold was lost: drop it (its Lost channel stays closed)
		// and take the lock anew once its node holds left are released.
		for i, in := range m.member {
			if in {
				stale = append(stale, i)
			}
		}
		m.forget()
	}
	m.mu.Unlock()
	m.releaseAll(ctx, stale)

	start := time.Now()
	use := m.idle()
	res := m.fanOut(ctx, use, m.acquireOn, func(res []nodeResult) bool {
		// Known: won; lost for want of answers; or lost to
		// another owner, with a quorum answering.
		ok, busy, failed := 0, 0, 0
		for i, x := range res {
			switch {
			case !use[i] || (x.done && x.err != nil):
				failed++
			case x.done && x.ok:
				ok++
			case x.done:
				busy++
			}
		}
		n, q := len(m.nodes), m.r.quorum
		return ok >= q || failed > n-q || (ok+busy >= q && busy+failed > n-q)
	}, m.lateAcquire)
	var got []int
	var errs []error
	answered, pttl, token := 0, int64(-1), int64(0)
	for i, x := range res {
		switch {
		case !use[i]:
			errs = append(errs, fmt.Errorf("node %d: an earlier call has not returned", i))
		case !x.done || x.err != nil:
			errs = append(errs, nodeErr(i, x))
		case x.ok:
			answered++
			got = append(got, i)
			token = max(token, x.token)
		default:
			answered++
			if x.pttl >= 0 && (pttl < 0 || x.pttl < pttl) {
				pttl = x.pttl
			}
		}
	}
	var late error
	if len(got) >= m.r.quorum {
		held := m.raise(ctx, got, token)
		elapsed := time.Since(start)
		if len(held) >= m.r.quorum && elapsed < m.lease-drift(m.lease) {
			m.commit(held, token)
			m.releaseAll(ctx, without(got, held))
			return true, 0, false, nil
		}
		if len(held) >= m.r.quorum {
			late = fmt.Errorf("%w: a quorum took %v, which leaves no validity of the lease %v",
				ErrQuorum, elapsed.Round(time.Millisecond), m.lease)
		}
	}
	m.releaseAll(ctx, got)
	switch {
	case ctx.Err() != nil:
		return false, 0, false, ctx.Err()
	case late != nil:
		return false, 0, false, late
	case answered < m.r.quorum:
		return false, 0, false, fmt.Errorf("%w: %d of %d nodes answered, %d needed: %w",
			ErrQuorum, answered, len(m.nodes), m.r.quorum, nodeErrors(errs))
	}
	return false, m.sleepFor(pttl), len(got) > 0, nil
}

// raise carries token to the counters of the nodes in got, and returns
// those that confirmed they still hold the lock.
func (m *RedMutex) raise(ctx context.Context, got []int, token int64) []int {
	res := m.fanOut(ctx, mask(len(m.nodes), got), func(ctx context.Context, i int) nodeResult {
		n := m.nodes[i]
		v, err := redlockRaiseScript.Run(ctx, n.c.rdb, []string{n.keys.Hash, n.keys.Token}, n.holdID(), token).Int64()
		if err != nil {
			return nodeResult{err: redisError(err)}
		}
		return nodeResult{ok: v == 1}
	}, m.quorumOK, nil)
	var held []int
	for _, i := range got {
		if res[i].ok {
			held = append(held, i)
		}
	}
	return held
}

// commit records a new hold on the nodes held, with its token.
func (m *RedMutex) commit(held []int, token int64) {
	m.mu.Lock()
	m.forget()
	m.count, m.token, m.lost = 1, token, make(chan struct{})
	for _, i := range held {
		m.member[i], m.alive[i] = true, true
	}
	m.nAlive = len(held)
	m.taken = time.Now()
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
}

// forget clears the current hold. m.mu must be held.
func (m *RedMutex) forget() {
	m.count, m.token, m.lost, m.isLost, m.nAlive = 0, 0, nil, false, 0
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
	if m.nAlive < m.r.quorum && m.count > 0 && !m.isLost {
		m.isLost = true
		close(m.lost)
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
	if m.r.err != nil || m.r.clients[0].events == nil {
		return
	}
	ev := m.r.clients[0].events
	e := Event{Kind: kind, Primitive: PrimitiveRedMutex, Name: m.name, Token: m.token, Err: err}
	if kind != KindHoldTaken {
		e.Held = time.Since(m.taken)
	}
	ev.emit(e)
}

// acquireOn makes one attempt on node i.
func (m *RedMutex) acquireOn(ctx context.Context, i int) nodeResult {
	ok, pttl, err := m.nodes[i].tryOnce(ctx, "barge")
	switch {
	case err != nil:
		return nodeResult{err: err}
	case !ok:
		return nodeResult{pttl: pttl}
	}
	return nodeResult{ok: true, token: m.nodes[i].Token()}
}

// lateAcquire undoes an attempt on node i that returned after its round
// gave up on it.
func (m *RedMutex) lateAcquire(i int, x nodeResult) {
	if x.ok {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = m.nodes[i].unlock(ctx)
	}
}

// releaseOn releases node i's hold: ok when it was released, neither ok
// nor an error when it was not there any more.
func (m *RedMutex) releaseOn(ctx context.Context, i int) nodeResult {
	err := m.nodes[i].unlock(ctx)
	switch {
	case err == nil:
		return nodeResult{ok: true}
	case errors.Is(err, ErrLockLost), errors.Is(err, ErrNotHeld):
		return nodeResult{}
	}
	return nodeResult{err: err}
}

// releaseAll releases the node holds of the nodes in idx, which are not
// part of a hold of m. It outlives ctx.
func (m *RedMutex) releaseAll(ctx context.Context, idx []int) {
	if len(idx) > 0 {
		m.fanOut(context.WithoutCancel(ctx), mask(len(m.nodes), idx), m.releaseOn, m.quorumOK, nil)
	}
}

// fanOut runs call on every node i with use[i], all at once, each with ctx
// bounded by the node timeout. It returns when all have returned or the
// node timeout has passed, with the results of those that returned (done).
// When settled (if not nil) finds the outcome known before that, the others
// are given as long again as that took (at least minGrace) to return, so that a node that is
// down does not slow every call down to the node timeout, while healthy
// nodes, which answer alike, are all waited for. A call still running when
// fanOut returns goes on in the background (Close waits for it) and hands
// its result to late, if any, when it returns; until then its node is left
// out of m's rounds.
func (m *RedMutex) fanOut(ctx context.Context, use []bool, call func(context.Context, int) nodeResult,
	settled func([]nodeResult) bool, late func(int, nodeResult)) []nodeResult {
	res := make([]nodeResult, len(m.nodes))
	var mu sync.Mutex // guards res, pending and abandoned
	pending, abandoned := 0, false
	done, early := make(chan struct{}), make(chan struct{})
	isEarly := false
	for i := range use {
		if use[i] {
			pending++
			m.setBusy(i, 1)
		}
	}
	if pending == 0 {
		return res
	}
	finish := func(i int, x nodeResult) {
		mu.Lock()
		if abandoned {
			mu.Unlock()
			if late != nil {
				late(i, x)
			}
			m.setBusy(i, -1)
			return
		}
		m.setBusy(i, -1)
		res[i] = x
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
			x := call(cctx, i)
			cancel()
			x.done = true
			finish(i, x)
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
func (m *RedMutex) setBusy(i, delta int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy[i] += delta
}

// idle returns the nodes a round may call: those with no call of m still
// running, and whose node Mutex holds nothing (a late grant not undone yet).
func (m *RedMutex) idle() []bool {
	use := make([]bool, len(m.nodes))
	m.mu.Lock()
	for i := range use {
		use[i] = m.busy[i] == 0
	}
	m.mu.Unlock()
	for i, n := range m.nodes { // their mu is taken before m.mu, never after
		use[i] = use[i] && n.current() == nil
	}
	return use
}

// joinConfirmed registers a waiter on every node whose channel is already
// subscribed and confirmed, which costs no round trip. It returns nil unless
// every node's is.
func (m *RedMutex) joinConfirmed() []*waiter {
	ws := make([]*waiter, len(m.nodes))
	for i, n := range m.nodes {
		if ws[i] = n.c.sub.joinConfirmed(n.keys.Channel, ""); ws[i] == nil {
			leaveAll(ws)
			return nil
		}
	}
	return ws
}

// join registers a waiter on every node's channel, all at once, and waits
// until each subscription is confirmed or the node timeout has passed.
func (m *RedMutex) join(ctx context.Context) ([]*waiter, error) {
	ws := make([]*waiter, len(m.nodes))
	errs := make([]error, len(m.nodes))
	var wg sync.WaitGroup
	for i, n := range m.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[i], errs[i] = n.c.sub.join(ctx, n.keys.Channel, "")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		leaveAll(ws)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, ErrClosed
	}
	return ws, nil
}

// leaveAll unregisters the waiters.
func leaveAll(ws []*waiter) {
	for _, w := range ws {
		if w != nil {
			w.leave()
		}
	}
}

// waitAny sleeps until a waiter of any node is signalled, d has passed (at
// most deafPoll while a node's channel is not confirmed), ctx ends or the
// Redlock is closed, and then consumes every signal received. It returns
// the waiters whose signal it consumed.
func (m *RedMutex) waitAny(ctx context.Context, ws []*waiter, d time.Duration) ([]*waiter, error) {
	cases := make([]reflect.SelectCase, 0, len(ws)+2)
	for _, w := range ws {
		w.s.mu.Lock()
		sig := w.signal
		if !w.ch.confirmed {
			d = min(d, deafPoll) // messages cannot reach it now
		}
		w.s.mu.Unlock()
		cases = append(cases, recvCase(sig), recvCase(w.s.closed))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	cases = append(cases, recvCase(t.C), recvCase(ctx.Done()))
	i, _, _ := reflect.Select(cases)
	switch {
	case i == len(cases)-1:
		return nil, ctx.Err()
	case i < len(cases)-2 && i%2 == 1:
		return nil, ErrClosed
	}
	var woken []*waiter
	for _, w := range ws {
		if _, signalled, _ := w.wait(ctx, 0, nil); signalled {
			woken = append(woken, w)
		}
	}
	return woken, nil
}

func recvCase[T any](ch <-chan T) reflect.SelectCase {
	return reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)}
}

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

// sleepFor is how long a waiter sleeps at most after a round that found
// the lock held with the given shortest PTTL (-1: none known).
func (m *RedMutex) sleepFor(pttl int64) time.Duration {
	if pttl < 0 {
		return m.recheck
	}
	return min(max(time.Duration(pttl)*time.Millisecond, time.Millisecond), m.recheck)
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
	select {
	case m.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// end gives back m's turn to talk to Redis.
func (m *RedMutex) end() { <-m.op }

// wrap adds the operation and the lock name to err.
func (m *RedMutex) wrap(op string, err error) error {
	var oe *opError
	if errors.As(err, &oe) && oe.name == m.name && oe.op == "redlock "+op {
		return err
	}
	return &opError{op: "redlock " + op, name: m.name, err: err}
}

// nodeErr describes a node's failed call.
func nodeErr(i int, x nodeResult) error {
	if !x.done {
		return fmt.Errorf("node %d: no reply within the node timeout", i)
	}
	return fmt.Errorf("node %d: %w", i, x.err)
}

// nodeErrors are the errors of several nodes, on one line.
type nodeErrors []error

func (e nodeErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e nodeErrors) Unwrap() []error { return e }

// mask returns a slice of n flags, set at idx.
func mask(n int, idx []int) []bool {
	use := make([]bool, n)
	for _, i := range idx {
		use[i] = true
	}
	return use
}

// without returns the elements of a not in b.
func without(a, b []int) []int {
	var out []int
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
