package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
	"github.com/redisync/redisync/internal/watchdog"
)

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
// ErrLockLost), so that two goroutines of the value are never inside at
// once: a Lock waits for that Unlock holding nothing in Redis (one queued
// before the loss, and granted the lock, gives it back to wait), and
// TryLock reports false.
//
// Make a Mutex with Client.NewMutex: every call of a zero Mutex fails with
// ErrInvalid.
type Mutex struct {
	c    *Client
	name string
	cfg  config
	keys schema.Lock

	holds
}

// NewMutex returns a Mutex for the lock called name. It does no I/O. It
// fails with an *OpError wrapping ErrInvalidName or ErrInvalidOption (and
// ErrInvalid) for an invalid name or option.
//
// The lock's keys and channel share the hash tag {name}, so that they live
// in one Redis Cluster slot.
func (c *Client) NewMutex(name string, opts ...Option) (*Mutex, error) {
	cfg := with(c.cfg, atMutex, opts)
	if err := cmp.Or(checkName(name), cfg.err); err != nil {
		return nil, wrapOp("new mutex", name, err)
	}
	return c.newMutex(name, cfg), nil
}

// newMutex returns a Mutex for the lock called name with the options cfg,
// both valid.
func (c *Client) newMutex(name string, cfg config) *Mutex {
	m := new(Mutex)
	c.initMutex(m, name, cfg)
	return m
}

// initMutex makes m, a zero Mutex, the Mutex that newMutex returns.
func (c *Client) initMutex(m *Mutex, name string, cfg config) {
	m.c, m.name, m.cfg = c, name, cfg
	m.keys = schema.LockKeys(cfg.prefix, name)
	m.holds = newHolds(c, PrimitiveMutex, name)
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
// A fair Lock that finds the lock's queue full (WithMaxWaiters) returns
// ErrQueueFull at once, without joining it. Lock returns ErrClosed after
// Close, and the errors of Redis. An error reaching Redis on the first
// attempt is returned at once; once Lock is waiting, it outlives Redis
// being unreachable or failing over, looking again with a growing pause
// until ctx ends. It is safe for concurrent use.
func (m *Mutex) Lock(ctx context.Context) error {
	return observed(m.c.observer(), ctx, CallInfo{Op: OpLock, Primitive: m.prim, Name: m.name}, m.lock, m.Token)
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
	if err := m.owedUnlock(ctx, true); err != nil {
		return m.wrap("lock", err)
	}
	ctx, stop := roundtrip.Marked(ctx)
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
	return observedTry(m.c.observer(), ctx, CallInfo{Op: OpTryLock, Primitive: m.prim, Name: m.name}, m.tryLock, m.Token)
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
	if m.owedUnlock(ctx, false) != nil {
		return false, nil // a lost hold of m still owes its Unlock
	}
	ctx, stop := roundtrip.Marked(ctx)
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

// lockCall is one Lock or TryLock call that takes the lock anew, under its
// own ticket.
type lockCall struct {
	m      *Mutex
	ticket string
	mode   string // of acquire.lua: "queue" (fair Lock), "barge" or "try"
	waits  bool   // the call waits: in mode "barge", it records its Client when it finds the lock taken
	waiter string // the address of the call's waiter, when not its ticket (a RedMutex's node attempt)
	meta   string // stored with the hold (WithMetadata; a campaign's value)

	pttl   int64  // the remaining lease of the lock's holder found by the last attempt
	record string // the call's record in the fair queue, once an attempt queued it
	seq    int64  // its number
	place
}

// newCall starts a call of m in the given mode under a new ticket.
func (m *Mutex) newCall(mode string) *lockCall {
	return &lockCall{m: m, ticket: m.c.ticket(m.cfg.label), mode: mode, meta: m.cfg.metadata, place: place{wd: m.c.wd}}
}

// attempt runs the acquire script once.
func (l *lockCall) attempt(ctx context.Context) (bool, time.Duration, error) {
	m := l.m
	if l.mode == "queue" && l.unsure && !l.queued {
		// A lost reply may have queued the ticket under a record this call
		// does not know: withdraw it, refused from now on, and go on under
		// a new ticket.
		l.withdraw(ctx)
		l.ticket = m.c.ticket(m.cfg.label)
	}
	sent := time.Now()
	// The arguments are read here, not in the call's goroutine, which an
	// abandoned call leaves running while the call's fields change. A
	// call that queued asks again ("again"): it learns whether its ticket
	// left the queue since (handed the lock, whose hold lapsed), rather
	// than queue it again and later take a stale grant to it.
	acquire := acquireArgs{ticket: l.ticket, lease: m.cfg.holdLease(), mode: l.mode, heartbeat: m.cfg.heartbeat,
		handoff: m.cfg.grantLease(), publish: m.c.publish, metadata: l.meta, most: m.cfg.maxWaiters}
	if l.mode == "queue" && l.queued {
		acquire.mode, acquire.seq = "again", l.seq
	}
	if l.mode == "barge" && l.waits {
		// Recorded for longer than the call sleeps between attempts.
		acquire.record = 2 * m.cfg.recheck
		acquire.others = m.c.sub.reg.PlainOthers(m.keys.GrantChannel(m.c.id), cmp.Or(l.waiter, l.ticket))
	}
	res, abandoned, err := m.c.rt.Attempt(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return m.c.runAcked(ctx, rdb, m.cfg, acquire.call(m.keys), granted)
	}, l.late(l.ticket))
	switch {
	case abandoned:
		l.failed(err, true)
		return false, 0, err
	case err != nil:
		l.failed(err, false)
		return false, 0, redisError(err)
	case res[0] == 1:
		return l.take(ctx, res[1], sent, m.cfg.holdLease(), false)
	case res[0] == -2 || res[0] == -3:
		// The ticket left the queue (handed the lock, lost since; or
		// dropped as dead), or was withdrawn (by a retry of the attempt
		// that found so): go on under a new one, so that a grant to the
		// old one still on its way is not taken for a new grant.
		l.left()
		l.ticket = m.c.ticket(m.cfg.label)
		return false, 0, nil
	case res[0] == -4:
		// The queue was full: the call did not join it. A copy of the
		// attempt that go-redis sent again may have joined all the same:
		// finish withdraws the ticket then.
		l.unsure = l.unsure || m.c.rt.MayCopy()
		return false, 0, fmt.Errorf("%w: %d calls wait for it already (WithMaxWaiters)", ErrQueueFull, res[1])
	}
	if len(res) == 4 {
		l.seq = res[2]
		l.record = schema.QueueRecord{Seq: res[2], Ticket: l.ticket, Joined: res[3] - acquire.heartbeat.Milliseconds(),
			Deadline: res[3], Handoff: acquire.handoff.Milliseconds(), Metadata: l.meta}.String()
	}
	if l.mode == "queue" {
		l.joined(sent)
	}
	l.pttl = res[1]
	return false, m.sleepFor(res[1]), nil
}

// take makes the hold granted to the ticket m's, its lease of length lease
// having been set no earlier than since (handoff: it was handed over).
// When m cannot take it, it is given back (and handed on): if its lease
// may have run out already, the call goes on waiting; if m has a lost
// hold not unlocked yet, a call that waits waits for that Unlock holding
// nothing, then queues again, and one that does not (a TryLock) reports
// the lock not taken.
func (l *lockCall) take(ctx context.Context, token int64, since time.Time, lease time.Duration, handoff bool) (bool, time.Duration, error) {
	m := l.m
	h := &hold{id: l.ticket, token: token, n: 1, handoff: handoff, refuse: l.unsure || l.abandoned || m.c.rt.MayCopy()}
	e := &watchdog.Entry{Kind: "hold", Owner: l.ticket, Keys: holdRenewKeys(m.keys),
		TTL: m.cfg.holdLease(), Hold: true, Renew: m.cfg.lease == 0,
		Release: func(ctx context.Context) error {
			if _, err := m.release(ctx, m.c.rdb, h); err != nil {
				return m.wrap("close", unconfirmed(err, "it runs out in Redis within its lease"))
			}
			return nil
		}}
	if m.cfg.maxHold > 0 {
		e.Until = since.Add(m.cfg.maxHold)
	}
	err := m.take(ctx, h, e, since, lease, l.waits || l.mode == "accept")
	if err == nil {
		l.left()
		return true, 0, nil
	}
	l.withdraw(ctx)
	switch {
	case errors.Is(err, errBusy) && l.waits:
		// m's last hold was lost and its Unlock is owed: wait for it
		// holding nothing, then attempt again under a new ticket.
		if err := m.owedUnlock(ctx, true); err != nil {
			return false, 0, err
		}
		l.ticket = m.c.ticket(m.cfg.label)
		return false, 0, nil
	case errors.Is(err, errBusy):
		return false, 0, nil
	case errors.Is(err, errExpired):
		// Attempt again at once, under a new ticket: the withdrawal of
		// this one may still be on its way, and must not meet a hold
		// taken anew under it.
		l.ticket = m.c.ticket(m.cfg.label)
		return false, 0, nil
	}
	return false, 0, err
}

// adopt takes the hold that a release handed to the ticket, announced by
// the message grant ("ticket:token:ms"). Its hand-off lease was set after
// the last call that Redis ran before the hand-off was sent (see
// place.confirmed).
func (l *lockCall) adopt(ctx context.Context, grant string) (bool, error) {
	token, ms, ours := parseGrant(grant, l.ticket)
	if !ours || l.m.cfg.replicas > 0 {
		// Not a grant of this call, or one to confirm with the
		// replicas: the attempt will tell, and take it if it is ours.
		return false, nil
	}
	ok, _, err := l.take(ctx, token, l.confirmed(ms), l.m.cfg.grantLease(), true)
	return ok, err
}

// outlasts: a waiting call outlives Redis restarting or failing over.
func (l *lockCall) outlasts(err error) bool { return l.m.c.rt.Outlasts(err) }

// sleeping keeps a queued ticket alive while the call sleeps.
func (l *lockCall) sleeping(ws *waiters.Set) {
	m := l.m
	l.keepAlive("wait", l.ticket, m.name, waitRenewKeys(m.keys), m.cfg.heartbeat, m.cfg.grantLease(), ws)
}

// finish ends the call: it stops the heartbeat and, when the call failed
// after sending something that may have queued or taken it, withdraws the
// ticket (handing on the lock if it was handed to it meanwhile). An
// abandoned attempt's late reply does that instead.
func (l *lockCall) finish(ctx context.Context, err error) {
	if l.mustWithdraw(err) {
		l.withdraw(ctx)
	}
	l.stop()
}

// withdraw gives up the ticket: it leaves the queue, the lock is handed on
// if it was handed to the ticket, and the ticket is refused from then on
// (a copy of one of its calls still on its way takes nothing). It waits
// for it at most roundtrip.CleanupWait.
func (l *lockCall) withdraw(ctx context.Context) {
	w := withdrawal{ticket: l.ticket, record: l.record, refuse: l.unsure || l.m.c.rt.MayCopy()}
	if !l.queued {
		w.record = ""
	}
	l.m.c.rt.Cleanup(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return nil, l.m.withdraw(ctx, rdb, w)
	})
	l.left()
	l.record, l.seq = "", 0
}

// address returns the ticket: the call's address in grant messages.
func (l *lockCall) address() string { return l.ticket }

// late returns what an abandoned attempt of ticket does with its reply:
// it withdraws the ticket, handing on the lock if the attempt (or a
// release) gave it the lock, and refuses it from then on (a copy of the
// attempt may still be on its way).
func (l *lockCall) late(ticket string) func([]int64, error) {
	m := l.m
	return func([]int64, error) {
		ctx, cancel := roundtrip.Detached(context.Background())
		defer cancel()
		_ = m.withdraw(ctx, m.c.rdb, withdrawal{ticket: ticket, refuse: true})
	}
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
// closed. A normal Unlock does not close it; an Unlock that finds the hold
// gone from Redis closes it before it returns ErrLockLost. When m holds
// nothing, Lost returns a closed channel: take it after Lock succeeds.
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
// ended (it returns why: ErrLockLost, ErrReleased), ctx has ended or the
// Client is closed.
func (m *Mutex) reenter(ctx context.Context, h *hold) error {
	if err := m.c.usable(); err != nil {
		return err
	}
	return reenter(ctx, &m.mu, &m.holds, h)
}

// post returns where a waiter for m's lock waits, heard through m's
// Client: its Client's grant channel of the lock, where only hand-offs to
// this process (fair waiters) and wake-ups of its plain waiters (barging)
// are published. A wake-up that finds no plain waiter left is passed on
// (Client.passOn).
func (m *Mutex) post() post {
	return post{sub: m.c.sub, channel: m.keys.GrantChannel(m.c.id), plain: m.cfg.barging}
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

// granted reports whether an acquire script's reply {status, value} says
// it took something (status 1).
func granted(res []int64) bool { return len(res) > 0 && res[0] == 1 }

// usable checks, before any call to Redis, that m can be used now.
func (m *Mutex) usable(ctx context.Context) error {
	return cmp.Or(m.c.usable(), ctx.Err())
}

// sleepFor is how long a waiter sleeps, at most, after an attempt found
// the lock held with the given PTTL.
func (m *Mutex) sleepFor(pttl int64) time.Duration {
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
