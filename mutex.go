package redisync

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// tombstoneTTL is how long Redis remembers a hold's release, so that a
// release retried by go-redis after a lost reply reports success.
const tombstoneTTL = 10 * time.Second

// Mutex is a lock shared by every process that uses the same name and key
// prefix on the same Redis.
//
// A Mutex value is used as a *sync.Mutex is: goroutines that share it
// exclude each other, as they exclude the holders of every other value of
// the same name, in this process or another. Each Lock call takes the
// lock on its own, under a ticket of its own: the hold is stored in Redis
// under it, a fair queue lists it in its arrival order, a hand-off names
// it, and its hold gets a fencing token of its own. So nothing granted to
// one call can be taken by another, and a call that gives up withdraws
// exactly what it asked for. Unlock may be called from any goroutine, as
// a sync.Mutex's may; it releases the value's hold.
//
// The lock is reentrant through the hold's context, not through the
// value: a Lock whose ctx comes from the hold (the ctx Do passes to its
// function, or HoldContext's) re-enters the hold, and only the Unlock of
// its last level releases it. Any other Lock waits its turn, even in the
// goroutine that holds the lock (it waits until its ctx ends).
//
// While the lock is held its lease is renewed by the Client's watchdog
// (unless WithFixedLease fixed it), and Lost tells when the hold is lost. A
// lost hold stays the value's until its Unlock (which returns
// ErrLockLost): a Lock of another goroutine granted the lock meanwhile
// returns only after that Unlock, so that two goroutines of the value are
// never inside at once.
type Mutex struct {
	c    *Client
	name string
	cfg  config
	keys schema.Lock
	err  error // invalid name or option

	holds
}

// NewMutex returns a Mutex for the lock called name. It does no I/O. An
// invalid name (ErrInvalidName) or option (ErrInvalidOption) is reported
// by every call of the Mutex, before any call to Redis.
//
// The lock's keys and channel share the hash tag {name}, so that they live
// in one Redis Cluster slot.
func (c *Client) NewMutex(name string, opts ...Option) *Mutex {
	return c.newMutex(name, with(c.cfg, atMutex, opts))
}

// newMutex returns a Mutex for the lock called name with the options cfg.
func (c *Client) newMutex(name string, cfg config) *Mutex {
	m := &Mutex{
		c:     c,
		name:  name,
		cfg:   cfg,
		keys:  schema.LockKeys(cfg.prefix, name),
		err:   cmp.Or(checkName(name), cfg.err),
		holds: newHolds(c, PrimitiveMutex, name),
	}
	return m
}

// Lock blocks until the lock is held for this call, ctx ends or the
// Client is closed. When ctx carries m's hold (it comes from Do or
// HoldContext), Lock re-enters that hold at once, with no call to Redis;
// ErrLockLost when that hold was lost, ErrReleased when it was released.
//
// A waiter sleeps until a message says the lock was handed to it (or, for
// a barging Mutex, that it was released), and in any case no longer
// than the lock's remaining lease or the recheck interval (WithRecheck), so
// no wait depends on a message arriving. When ctx ends first, Lock returns
// ctx.Err() wrapped within 25 ms, whatever the go-redis
// client's timeouts, and leaves nothing behind: no hold, no place in the
// queue, no subscription (clean-up still under way then goes on in the
// background; Close waits for it).
//
// Lock returns ErrClosed after Close, and the errors of Redis. An error
// reaching Redis on the first attempt is returned at once; once Lock is
// waiting, it outlives Redis being unreachable or failing over, looking
// again with a growing pause until ctx ends. It is safe for concurrent
// use.
func (m *Mutex) Lock(ctx context.Context) error {
	return observed(m.c.obs, ctx, Call{Op: OpLock, Primitive: m.prim, Name: m.name}, m.lock, m.Token)
}

// lock is Lock, unobserved.
func (m *Mutex) lock(ctx context.Context) error {
	if h := holdIn(ctx, &m.holds); h != nil {
		return m.wrapIf("lock", m.reenter(ctx, h))
	}
	if err := m.usable(ctx); err != nil {
		return m.wrap("lock", err)
	}
	leave, err := m.c.enter(ctx, m.keys.GrantChannel(m.c.id))
	if err != nil {
		return m.wrap("lock", err)
	}
	defer leave()
	ctx, stop := marked(ctx)
	defer stop()
	mode := "barge"
	if !m.cfg.barging {
		mode = "queue"
	}
	l := m.newCall(mode)
	l.waits = true
	return m.wrapIf("lock", block(ctx, []post{m.post()}, l))
}

// TryLock makes one attempt to take the lock and never waits: it reports
// whether the lock is held for this call now. When ctx carries m's hold it
// re-enters it, as Lock does. Otherwise it is false while anyone holds the
// lock, another goroutine of m included. Unless m barges, it does not take
// the lock ahead of queued waiters.
func (m *Mutex) TryLock(ctx context.Context) (bool, error) {
	return observedTry(m.c.obs, ctx, Call{Op: OpTryLock, Primitive: m.prim, Name: m.name}, m.tryLock, m.Token)
}

// tryLock is TryLock, unobserved.
func (m *Mutex) tryLock(ctx context.Context) (bool, error) {
	if h := holdIn(ctx, &m.holds); h != nil {
		err := m.reenter(ctx, h)
		return err == nil, m.wrapIf("trylock", err)
	}
	if err := m.usable(ctx); err != nil {
		return false, m.wrap("trylock", err)
	}
	leave, err := m.c.enter(ctx, m.keys.GrantChannel(m.c.id))
	if err != nil {
		return false, m.wrap("trylock", err)
	}
	defer leave()
	ctx, stop := marked(ctx)
	defer stop()
	mode := "barge"
	if !m.cfg.barging {
		mode = "try"
	}
	ok, _, err := m.tryOnce(ctx, mode, "")
	return ok, m.wrapIf("trylock", err)
}

// tryOnce makes one attempt under a new ticket, in the given mode, never
// queueing. waiter is the address under which the caller's waiter is
// registered when the caller waits if the attempt fails (a RedMutex's
// Lock), "" when it does not (TryLock). It reports whether m holds the
// lock now and, if not, the lock's PTTL.
func (m *Mutex) tryOnce(ctx context.Context, mode, waiter string) (bool, int64, error) {
	l := m.newCall(mode)
	l.waits, l.waiter = waiter != "", waiter
	ok, _, err := l.attempt(ctx)
	if err != nil || !ok {
		l.finish(ctx, err)
	}
	return ok, l.pttl, err
}

// Unlock releases one level of m's hold: of the hold that ctx carries
// (see Lock), or else of the value's hold, whichever goroutine took it.
// The last level releases the lock, which goes to the next fair waiter,
// if any, or wakes a barging waiter of one process. It returns ErrNotHeld
// when m holds nothing, and ErrLockLost when the hold had been lost (the
// lock may have had another owner since); it never touches another
// owner's hold, nor a later hold of m. Releasing an inner level asks
// nothing of Redis: a loss not noticed yet (Lost still open) is reported
// by the last level's Unlock.
//
// The last level's release is sent even when ctx has ended already (as
// after a deferred Unlock of a call that timed out), with a timeout of its
// own. m forgets the hold before the release is sent: the hold is no longer
// renewed, so when the release fails, or ctx ends before it is confirmed,
// the lock is freed by Redis within one lease; the error says so.
func (m *Mutex) Unlock(ctx context.Context) error {
	return observed(m.c.obs, ctx, Call{Op: OpUnlock, Primitive: m.prim, Name: m.name}, m.unlock, nil)
}

// unlock is Unlock, unobserved: a RedMutex releases its node holds with it.
func (m *Mutex) unlock(ctx context.Context) error {
	m.mu.Lock()
	h := holdIn(ctx, &m.holds)
	switch {
	case h == nil:
		h = m.cur
	case h.cause == ErrReleased:
		h = nil // released already
	}
	if err := cmp.Or(m.err, m.c.usable()); err != nil {
		if h != nil && errors.Is(err, ErrClosed) {
			// Lost with the Client, which may have collected the
			// holds to release already, or not: release it here too
			// (a second release finds nothing).
			m.loseLocked(h)
			m.forgetLocked(h)
		}
		m.mu.Unlock()
		if h != nil && errors.Is(err, ErrClosed) {
			m.c.cleanup(ctx, func(ctx context.Context) ([]int64, error) {
				_, err := m.release(ctx, h.id, h.token, "release")
				return nil, err
			})
		}
		return m.wrap("unlock", err)
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
	m.forgetUntoldLocked(h) // a lost hold was told already
	m.mu.Unlock()

	if lost {
		// Nothing left to protect; remove the hold if it is still
		// there, so that the lock is free sooner.
		m.releaseLost(ctx, h)
		return m.wrap("unlock", ErrLockLost)
	}
	wait, cancel := releasing(ctx)
	defer cancel()
	res, _, err := m.c.settle(wait, func(ctx context.Context) (int64, error) {
		return m.release(ctx, h.id, h.token, "release")
	}, nil)
	m.told(h, err == nil && res == 0) // found gone: lost, not released
	switch {
	case err != nil:
		return m.wrap("unlock", notConfirmed(err))
	case res == 0:
		return m.wrap("unlock", ErrLockLost)
	}
	return nil
}

// Token returns the fencing token of m's current hold, or 0 when m does not
// hold the lock. Tokens of a lock name strictly increase with every new
// hold (re-entering does not mint one), so a resource that rejects a token
// lower than the highest it has seen is safe from a holder that paused past
// its lease.
func (m *Mutex) Token() int64 { return m.token() }

// Lost returns a channel that is closed when m's current hold is lost: its
// lease could not be renewed in time, the lock's key was removed or
// changed behind its back, its fixed lease ran out, or the Client was
// closed. A normal Unlock does not close it. When m holds nothing, Lost
// returns nil (a channel that never delivers).
func (m *Mutex) Lost() <-chan struct{} { return m.lostChan() }

// Name returns the name of the lock.
func (m *Mutex) Name() string { return m.name }

// HoldContext returns a context, derived from parent, that is cancelled
// the moment m's current hold ends, so that work started under the lock
// stops by itself: context.Cause then says why, ErrLockLost when the hold
// was lost (Lost closed; a Handoff counts as one) and ErrReleased when the
// last Unlock released it. When m holds nothing it is cancelled already,
// with cause ErrNotHeld. It carries the hold: a Lock with it, or with a
// context derived from it, re-enters the hold. Call the CancelFunc when
// the work is done, as for context.WithCancel.
func (m *Mutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return m.context(parent)
}

// Do locks m, runs fn with a context of the hold (see HoldContext), and
// unlocks that hold, even when fn fails, panics (the panic goes on once
// the lock is released) or the hold is lost: it returns fn's error joined
// with Unlock's (ErrLockLost when the hold was lost meanwhile). When ctx
// carries m's hold already (a Do inside a Do of m), Do re-enters it. When
// Lock fails, fn does not run and Do returns Lock's error.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return do(ctx, &m.holds, &m.mu, m.Lock, m.Unlock, fn)
}

// reenter adds a level to h, m's hold that ctx carries, unless h has
// ended: it returns why then (ErrLockLost, ErrReleased).
func (m *Mutex) reenter(ctx context.Context, h *hold) error {
	m.mu.Lock()
	if h.isLost || h.cause != nil {
		m.mu.Unlock()
		return cmp.Or(h.cause, ErrLockLost)
	}
	h.n++
	m.mu.Unlock()
	noteHold(ctx, h)
	return nil
}

// post returns where a waiter for m's lock waits, heard through m's
// Client: its Client's grant channel of the lock, where only hand-offs to
// this process (fair waiters) and wake-ups of its plain waiters (barging)
// are published. A wake-up that finds no plain waiter left is passed on
// (Client.passOn).
func (m *Mutex) post() post {
	return post{sub: m.c.sub, channel: m.keys.GrantChannel(m.c.id), plain: m.cfg.barging}
}

// passOn passes on a wake-up of plain waiters that reached the Client on
// channel when none was left to take it (a cancelled Lock; a channel
// being unsubscribed; a reconnect that may have lost it): if channel is a
// lock's grant channel, scripts/wake.lua wakes the next Client recorded as
// having plain waiters while the lock is free. It never waits.
func (c *Client) passOn(channel string) {
	k, ok := schema.LockOfGrantChannel(channel)
	if !ok {
		return
	}
	c.background(func(ctx context.Context) {
		// Again while Redis cannot serve it for now (a restart, a
		// failover): the release took the record out already.
		_ = c.persist(ctx, func() error { return wakeCall(k, c.publish).run(ctx, c.rdb).Err() })
	})
}

// holdID returns the Redis field of m's hold, or "".
func (m *Mutex) holdID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cur == nil {
		return ""
	}
	return m.cur.id
}

// release runs the release script for the hold (or ticket) id, in mode
// "release" or "withdraw" (see release.lua).
func (m *Mutex) release(ctx context.Context, id string, token int64, mode string) (int64, error) {
	release := releaseArgs{id: id, token: token, publish: m.c.publish, mode: mode}
	res, err := release.call(m.keys).run(ctx, m.c.rdb).Int64()
	if err != nil {
		return 0, redisError(err)
	}
	return res, nil
}

// releaseLost removes h, a hold that was lost, from Redis if it is still
// there, so that the lock is free sooner; in the background after
// cleanupWait.
func (m *Mutex) releaseLost(ctx context.Context, h *hold) {
	m.c.cleanup(ctx, func(ctx context.Context) ([]int64, error) {
		_, err := m.release(ctx, h.id, 0, "release")
		return nil, err
	})
}

// granted reports whether an acquire script's reply {status, value} says
// it took something (status 1).
func granted(res []int64) bool { return len(res) > 0 && res[0] == 1 }

// usable checks, before any call to Redis, that m can be used now.
func (m *Mutex) usable(ctx context.Context) error {
	return cmp.Or(m.err, m.c.usable(), ctx.Err())
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
	return wrapOp(op, m.name, err)
}

// wrapIf is wrap, and nil for a nil err.
func (m *Mutex) wrapIf(op string, err error) error {
	if err == nil {
		return nil
	}
	return m.wrap(op, err)
}
