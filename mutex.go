package redisync

import (
	"cmp"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// tombstoneTTL is how long Redis remembers an owner's last full release,
// so that a release retried by go-redis after a lost reply reports success.
const tombstoneTTL = 10 * time.Second

// Mutex is a reentrant lock shared by every process that uses the same
// name and key prefix on the same Redis.
//
// A Mutex value is one owner, like a thread holding a java.util.concurrent
// ReentrantLock: Lock on a value that already holds the lock re-enters it
// (the hold count goes up by one) and only the last matching Unlock
// releases it. Different values, in one process or many, exclude each
// other: give each goroutine that must be excluded its own value (NewMutex
// is cheap). A value is safe for concurrent use, but goroutines sharing one
// value share its holds and do not exclude each other.
//
// While the lock is held its lease is renewed by the Client's watchdog
// (unless WithLease fixed it), and Lost tells when the hold is lost.
type Mutex struct {
	c       *Client
	name    string
	cfg     config
	owner   string
	keys    []string // lock hash, token counter, queue, waiters, tombstone
	channel string
	err     error // invalid name or option

	op chan struct{} // held by the call of this value that talks to Redis

	mu     sync.Mutex // guards the fields below
	count  int64      // hold count; 0: not held
	token  int64
	lost   chan struct{} // of the current hold; closed when it is lost
	isLost bool
	ka     *keepalive // the current hold's watchdog entry

	// lostHook, when set (before first use), is called by markLost right
	// after the Lost channel is closed, with mu held: a Redlock counts its
	// nodes' lost holds through it.
	lostHook func()
}

// NewMutex returns a Mutex for the lock called name. It does no I/O. An
// empty or too long name (ErrInvalidName) or an invalid option
// (ErrInvalidOption) is reported by every call of the Mutex, before any
// call to Redis.
//
// The lock's keys and channel share the hash tag {name}, so that they live
// in one Redis Cluster slot.
func (c *Client) NewMutex(name string, opts ...Option) *Mutex {
	cfg := c.cfg.with(opts)
	m := &Mutex{
		c:     c,
		name:  name,
		cfg:   cfg,
		owner: c.newOwner(),
		op:    make(chan struct{}, 1),
		err:   cmp.Or(checkName(name), cfg.err),
	}
	base := cfg.prefix + ":lock:{" + name + "}"
	m.keys = []string{base, base + ":token", base + ":queue", base + ":waiters", base + ":released:" + m.owner}
	m.channel = base + ":ch"
	return m
}

// Lock blocks until m holds the lock, ctx ends or the Client is closed. If
// m already holds it, Lock re-enters at once.
//
// A waiter sleeps until a message on the lock's channel says the lock was
// released (or handed to it, for a fair Mutex), and in any case no longer
// than the lock's remaining lease or the recheck interval (WithRecheck), so
// no wait depends on a message arriving. When ctx ends first, Lock returns
// ctx.Err() wrapped, and leaves nothing behind: no hold, no place in the
// queue, no subscription.
//
// Lock returns ErrLockLost when m's current hold has been lost (Unlock it
// first), ErrClosed after Close, and the errors of Redis. An error reaching
// Redis on the first attempt is returned at once; once Lock is waiting, it
// outlives Redis being unreachable or failing over, looking again with a
// growing pause until ctx ends. It is safe for concurrent use.
func (m *Mutex) Lock(ctx context.Context) error {
	if err := m.c.block(ctx, m.channel, m.owner, m.cfg.recheck, lockCall{m}); err != nil {
		return m.wrap("lock", err)
	}
	return nil
}

// TryLock makes one attempt to take the lock and never waits: it reports
// whether m holds the lock now (re-entering if it already did). A fair
// Mutex does not take the lock ahead of queued waiters.
func (m *Mutex) TryLock(ctx context.Context) (bool, error) {
	acquired, _, err := m.attempt(ctx, false)
	if err != nil {
		return false, m.wrap("trylock", err)
	}
	return acquired, nil
}

// Unlock releases one level of m's hold; the last level releases the lock,
// which goes to the next fair waiter, if any, or wakes one waiter in each
// process. It returns ErrNotHeld when m holds nothing, and ErrLockLost
// when the hold had been lost (the lock may have had another owner since);
// it never touches another owner's hold.
//
// When the last level's release fails on the network, m forgets the hold
// anyway and its lease, no longer renewed, frees the lock in Redis.
func (m *Mutex) Unlock(ctx context.Context) error {
	if err := m.begin(ctx); err != nil {
		return m.wrap("unlock", err)
	}
	defer m.end()

	m.mu.Lock()
	count, token, lost, ka := m.count, m.token, m.isLost, m.ka
	m.mu.Unlock()
	switch {
	case count == 0:
		return m.wrap("unlock", ErrNotHeld)
	case lost:
		if count == 1 {
			// Nothing left to protect; remove our field if it is
			// still there, so the lock is free sooner.
			_, _ = m.release(ctx, 1, 0, false)
		}
		m.drop()
		return m.wrap("unlock", ErrLockLost)
	case count == 1:
		m.c.wd.remove(ka) // before the release: no renewal may outlive it
	}

	sent := time.Now()
	// The release is idempotent: one that cannot reach Redis for now (a
	// failover under way) is sent again for a while.
	var res int64
	err := m.c.persist(ctx, func() (err error) {
		res, err = m.release(ctx, count, token, false)
		return err
	})
	if count == 1 {
		m.drop()
	}
	switch {
	case err != nil:
		return m.wrap("unlock", err)
	case res == 0:
		if count > 1 {
			m.markLost(ka)
			m.drop()
		}
		return m.wrap("unlock", ErrLockLost)
	case count > 1:
		m.drop()
		m.c.wd.rearm(ka, sent)
	}
	return nil
}

// Token returns the fencing token of m's current hold, or 0 when m does not
// hold the lock. Tokens of a lock name strictly increase with every new
// hold (re-entering does not mint one), so a resource that rejects a token
// lower than the highest it has seen is safe from a holder that paused past
// its lease.
func (m *Mutex) Token() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.token
}

// Lost returns a channel that is closed when m's current hold is lost: its
// lease could not be renewed in time, the lock's key was removed or
// changed behind its back, its fixed lease ran out, or the Client was
// closed. A normal Unlock does not close it. When m holds nothing, Lost
// returns nil (a channel that never delivers).
func (m *Mutex) Lost() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost
}

// Name returns the name of the lock.
func (m *Mutex) Name() string { return m.name }

// attempt runs the acquire script once. queue says whether a fair Mutex
// joins the queue when the lock is not granted. It returns whether m holds
// the lock now and, when it does not, the lock's PTTL.
func (m *Mutex) attempt(ctx context.Context, queue bool) (acquired bool, pttl int64, err error) {
	if err := m.begin(ctx); err != nil {
		return false, 0, err
	}
	defer m.end()

	m.mu.Lock()
	held, lost := m.count, m.isLost
	m.mu.Unlock()
	if lost {
		return false, 0, ErrLockLost
	}
	mode := "barge"
	if m.cfg.fair {
		mode = "try"
		if queue {
			mode = "queue"
		}
	}
	sent := time.Now()
	res, err := m.c.runAcked(ctx, m.cfg, acquireScript, m.keys[:4], []any{
		m.owner, m.lease().Milliseconds(), held, mode,
		m.cfg.heartbeat.Milliseconds(), m.handoffLease().Milliseconds(),
		m.channel, m.c.publish}, granted)
	if err != nil {
		if mayHaveRun(err) {
			// The script may have run and only its reply was lost.
			m.undo(ctx, held)
		}
		return false, 0, redisError(err)
	}
	switch res[0] {
	case 1:
		m.hold(res[1], sent, m.lease())
		return true, 0, nil
	case -1:
		m.markLost(nil)
		return false, 0, ErrLockLost
	}
	return false, res[1], nil
}

// granted reports whether an acquire script's reply {status, value} says
// it took something (status 1).
func granted(res []int64) bool { return len(res) > 0 && res[0] == 1 }

// adopt takes a hold that a release handed to m, announced by a message
// "owner:token" received at received. It reports false when m holds the
// lock already (a concurrent call of the same value adopted it), for the
// caller to attempt again.
func (m *Mutex) adopt(ctx context.Context, grant string, received time.Time) (bool, error) {
	token, err := strconv.ParseInt(grant[strings.LastIndexByte(grant, ':')+1:], 10, 64)
	if err != nil || m.cfg.replicas > 0 {
		// Not a grant of ours, or one to confirm with the replicas:
		// the attempt will tell, and adopt the hold if it is ours.
		return false, nil
	}
	if err := m.begin(ctx); err != nil {
		m.withdraw(ctx) // passes the lock on
		return false, err
	}
	defer m.end()
	m.mu.Lock()
	held := m.count
	m.mu.Unlock()
	if held > 0 {
		return false, nil
	}
	m.hold(token, received, m.handoffLease())
	return true, nil
}

// hold records a successful acquire. A new hold (count 0 -> 1) gets its
// token and Lost channel and is registered with the watchdog, its lease of
// length lease having been set by a call sent at sent.
func (m *Mutex) hold(token int64, sent time.Time, lease time.Duration) {
	m.mu.Lock()
	m.count++
	if m.count > 1 {
		ka := m.ka
		m.mu.Unlock()
		m.c.wd.rearm(ka, sent)
		return
	}
	lost := make(chan struct{})
	ka := &keepalive{
		kind:  "hold",
		owner: m.owner,
		keys:  m.keys[:1],
		ttl:   m.lease(),
		hold:  true,
		renew: m.cfg.lease == 0,
	}
	ka.gone = func() { m.markLost(ka) }
	m.token, m.lost, m.isLost, m.ka = token, lost, false, ka
	m.mu.Unlock()
	if !m.c.wd.add(ka, sent, lease) {
		m.markLost(ka) // the Client was closed meanwhile
	}
}

// markLost closes the Lost channel of the hold whose watchdog entry is ka
// (nil: the current hold), unless m has moved on to another hold.
func (m *Mutex) markLost(ka *keepalive) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.count == 0 || m.isLost || (ka != nil && ka != m.ka) {
		return
	}
	m.isLost = true
	close(m.lost)
	if m.lostHook != nil {
		m.lostHook()
	}
	m.c.wd.remove(m.ka)
}

// drop forgets one level of m's hold, and the whole hold at the last one.
func (m *Mutex) drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.count--; m.count <= 0 {
		m.count, m.token, m.lost, m.isLost, m.ka = 0, 0, nil, false, nil
	}
}

// heartbeat registers a queued fair waiter with the watchdog, which keeps
// its place alive and nudges w when it finds the waiter dequeued (handed
// the lock, or dropped), or the lock free with nobody to announce it (a
// hand-off to a waiter that died has run out).
func (m *Mutex) heartbeat(w *waiter) *keepalive {
	hb := &keepalive{
		kind:  "wait",
		owner: m.owner,
		keys:  []string{m.keys[2], m.keys[3], m.keys[0]},
		ttl:   m.cfg.heartbeat,
		renew: true,
		gone:  w.nudge,
		free:  w.nudge,
	}
	if !m.c.wd.add(hb, time.Now(), m.cfg.heartbeat) {
		return nil
	}
	return hb
}

// release runs the release script for a hold count of held; withdraw
// also removes m from the fair queue.
func (m *Mutex) release(ctx context.Context, held, token int64, withdraw bool) (int64, error) {
	flag := ""
	if withdraw {
		flag = "withdraw"
	}
	res, err := releaseScript.Run(ctx, m.c.rdb, m.keys,
		m.owner, held, m.lease().Milliseconds(), token, tombstoneTTL.Milliseconds(),
		m.channel, m.c.publish, flag).Int64()
	if err != nil {
		return 0, redisError(err)
	}
	return res, nil
}

// undo reverts an acquire sent with a hold count of held whose reply was
// lost, if it was applied, and leaves the queue. It outlives ctx.
func (m *Mutex) undo(ctx context.Context, held int64) {
	ctx, cancel := detached(ctx)
	defer cancel()
	_, _ = m.release(ctx, held+1, 0, true)
}

// withdraw leaves the fair queue after a wait ended without the lock; if
// the lock was handed to m meanwhile, it passes it on.
func (m *Mutex) withdraw(ctx context.Context) {
	if m.cfg.fair {
		m.undo(ctx, 0)
	}
}

// begin checks that m can be used and takes m's turn to talk to Redis.
func (m *Mutex) begin(ctx context.Context) error {
	if m.err != nil {
		return m.err
	}
	if err := m.c.usable(); err != nil {
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
	case <-m.c.ctx.Done():
		return ErrClosed
	}
}

// end gives back m's turn to talk to Redis.
func (m *Mutex) end() { <-m.op }

// lease is the lease set by an acquire.
func (m *Mutex) lease() time.Duration {
	return cmp.Or(m.cfg.lease, m.cfg.watchdog)
}

// handoffLease is the lease of a hold handed to m by a release: short under
// the watchdog, which extends it, so that a hand-off to a waiter that just
// died costs little.
func (m *Mutex) handoffLease() time.Duration {
	if m.cfg.lease > 0 {
		return m.cfg.lease
	}
	return min(m.cfg.heartbeat, m.cfg.watchdog)
}

// sleepFor is how long a waiter sleeps, at most, after an attempt found
// the lock held with the given PTTL.
func (m *Mutex) sleepFor(pttl int64) time.Duration {
	if pttl < 0 { // -1: no TTL; -2: gone since
		if pttl == -2 {
			return time.Millisecond
		}
		return m.cfg.recheck
	}
	return min(max(time.Duration(pttl)*time.Millisecond, time.Millisecond), m.cfg.recheck)
}

// wrap adds the operation and the lock name to err.
func (m *Mutex) wrap(op string, err error) error {
	var oe *opError
	if errors.As(err, &oe) {
		return err
	}
	return &opError{op: op, name: m.name, err: err}
}

// mayHaveRun reports whether a command that failed with err may have run
// in Redis all the same: its reply was lost, rather than Redis answering
// with an error or the connection failing before anything was sent.
func mayHaveRun(err error) bool {
	var op *net.OpError
	return !isReply(err) && !(errors.As(err, &op) && op.Op == "dial")
}

// isReply reports whether err is an error reply from Redis (the command
// ran and failed) rather than a failure to get a reply.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}
