package redisync

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/redisync/redisync/internal/waiters"
	"github.com/redisync/redisync/internal/watchdog"
)

// lockCall is one Lock or TryLock call that takes the lock anew, under its
// own ticket.
type lockCall struct {
	m      *Mutex
	ticket string
	mode   string // of acquire.lua: "queue" (fair Lock), "barge" or "try"
	waits  bool   // the call waits: in mode "barge", it records its Client when it finds the lock taken
	waiter string // the address of the call's waiter, when not its ticket (a RedMutex's node attempt)
	meta   string // stored with the hold (WithMetadata; a campaign's value)

	pttl int64 // the lock's PTTL found by the last attempt
	place
}

// newCall starts a call of m in the given mode under a new ticket.
func (m *Mutex) newCall(mode string) *lockCall {
	return &lockCall{m: m, ticket: m.c.ticket(m.cfg.label), mode: mode, meta: m.cfg.metadata, place: place{wd: m.c.wd}}
}

// attempt runs the acquire script once.
func (l *lockCall) attempt(ctx context.Context) (bool, time.Duration, error) {
	m := l.m
	sent := time.Now()
	// The arguments are read here, not in the call's goroutine, which an
	// abandoned call leaves running while the call's fields change.
	// queued: an earlier attempt queued the ticket, or may have (its
	// reply was lost): this one must learn if the ticket left the queue
	// since (handed the lock, whose hold lapsed), rather than queue it
	// again and later take a stale grant to it.
	acquire := acquireArgs{ticket: l.ticket, lease: m.cfg.holdLease(), mode: l.mode, heartbeat: m.cfg.heartbeat,
		handoff: m.cfg.grantLease(), publish: m.c.publish, queued: l.queued || l.unsure, metadata: l.meta}
	if l.mode == "barge" && l.waits {
		// Recorded for longer than the call sleeps between attempts.
		acquire.record = 2 * m.cfg.recheck
		acquire.others = m.c.sub.reg.PlainOthers(m.keys.GrantChannel(m.c.id), cmp.Or(l.waiter, l.ticket))
	}
	res, abandoned, err := m.c.callTaking(ctx, func(ctx context.Context) ([]int64, error) {
		return m.c.runAcked(ctx, m.cfg, acquire.call(m.keys), granted)
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
// hold not unlocked yet, a call that waits waits for that Unlock, and
// one that does not (a TryLock) reports the lock not taken.
func (l *lockCall) take(ctx context.Context, token int64, since time.Time, lease time.Duration, handoff bool) (bool, time.Duration, error) {
	m := l.m
	h := &hold{id: l.ticket, token: token, n: 1, handoff: handoff}
	e := &watchdog.Entry{Kind: "hold", Owner: l.ticket, Keys: holdRenewKeys(m.keys),
		TTL: m.cfg.holdLease(), Hold: true, Renew: m.cfg.lease == 0,
		Release: func(ctx context.Context) { _, _ = m.release(ctx, h.id, h.token, "release") }}
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
func (l *lockCall) outlasts(err error) bool { return l.m.c.outlasts(err) }

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
// for it at most cleanupWait.
func (l *lockCall) withdraw(ctx context.Context) {
	ticket := l.ticket
	l.m.c.cleanup(ctx, func(ctx context.Context) ([]int64, error) {
		_, err := l.m.release(ctx, ticket, 0, "withdraw")
		return nil, err
	})
	l.left()
}

// address returns the ticket: the call's address in grant messages.
func (l *lockCall) address() string { return l.ticket }

// late returns what an abandoned attempt of ticket does with its reply:
// it withdraws the ticket, handing on the lock if the attempt (or a
// release) gave it the lock.
func (l *lockCall) late(ticket string) func([]int64, error) {
	m := l.m
	return func([]int64, error) {
		ctx, cancel := detached(context.Background())
		defer cancel()
		_, _ = m.release(ctx, ticket, 0, "withdraw")
	}
}
