package redisync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/waiters"
	"github.com/redisync/redisync/internal/watchdog"
)

// acquireCall is one Acquire or TryAcquire call.
type acquireCall struct {
	s    *Semaphore
	n    int64
	mode string // of sem_acquire.lua: "queue" or "try"
	// holder is the id under which Redis records the permits of the
	// holding the call adds to: onto's, the value's holding when the
	// call started, or, when the value held nothing, a new one. When onto
	// ends before the call is granted, the grant makes a new holding under
	// onto's id only if onto's release was confirmed; otherwise Redis may
	// count some of onto's permits under it still, and the call gives the
	// grant back and goes on under a new id.
	holder string
	onto   *hold
	// waiter is the call's id in the queue and on the channel:
	// "holder#digits", one per call, so that a message granting an
	// earlier call is never taken for this one: 30 random digits (see
	// appendRandomDigits), which keep it unknown to other publishers on
	// the grant channel even when they learnt holder from an earlier
	// grant, then the call's number. Digits only after the '#', as every
	// version's scripts read a waiter id (sem_lib.lua, sem_holder): a
	// semaphore's layout is shared with earlier versions.
	waiter string
	// more is set by an attempt that the script stopped at one of its
	// bounds (ended leases to reclaim, waiters to serve): a call at once
	// goes on where it stopped.
	more bool
	place
}

// newCall numbers a new call of s for n permits. s.turn must be held.
func (s *Semaphore) newCall(n int64, mode string) *acquireCall {
	a := &acquireCall{s: s, n: n, mode: mode, onto: s.current(), place: place{wd: s.c.wd}}
	if a.onto != nil {
		a.holder = a.onto.id // immutable
	} else {
		a.holder = s.c.ticket(s.cfg.label)
	}
	a.waiter = s.nextWaiter(a.holder)
	return a
}

// nextWaiter mints the id of a new call of s for holder. s.turn must be
// held.
func (s *Semaphore) nextWaiter(holder string) string {
	s.calls++
	b := make([]byte, 0, len(holder)+52)
	b = appendRandomDigits(append(append(b, holder...), '#'))
	return string(strconv.AppendInt(b, s.calls, 10))
}

// attempt runs the acquire script once. It reports whether s holds n more
// permits now and, when not, how long to sleep at most: 0 when the call
// is to attempt again at once (as a new call, or to go on where the
// script stopped at a bound: then a.more is set).
func (a *acquireCall) attempt(ctx context.Context) (bool, time.Duration, error) {
	s := a.s
	if a.onto != nil && !a.queued && s.current() != a.onto {
		// The holding the call adds to ended before the call queued:
		// Redis refuses a first call under its id (a late copy of
		// one must take nothing). Go on as a call of a new holding.
		a.anew(ctx)
	}
	a.more = false
	if err := s.op.take(ctx, s.c.ctx.Done()); err != nil {
		return false, 0, err
	}
	s.mu.Lock()
	h, held := s.cur, s.heldBy(a.holder)
	lost := h != nil && h.isLost
	s.mu.Unlock()
	if lost {
		s.end()
		return false, 0, ErrLockLost
	}
	s.seq++
	if a.mode == "queue" {
		s.queuedAs = a.waiter
	}
	// The arguments are read here, not in the call's goroutine (see
	// lockCall.attempt).
	sent, n, holder, waiter := time.Now(), a.n, a.holder, a.waiter
	acquire := semAcquireArgs{holder: holder, n: n, size: s.Size(), held: held, seq: s.seq, lease: s.cfg.holdLease(), mode: a.mode,
		waiter: waiter, queued: a.queued || a.unsure, heartbeat: s.cfg.heartbeat, grant: s.cfg.grantLease(), publish: s.c.publish,
		fence: s.fence}.call(s.keys)
	res, abandoned, err := s.c.rt.Attempt(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return s.c.runAcked(ctx, rdb, s.cfg, acquire, granted)
	}, func([]int64, error) {
		// Abandoned: give back what the attempt (or a release) granted
		// the call, then let s's next call talk to Redis.
		defer s.end()
		s.withdraw(context.Background(), s.c.rdb, holder, n, waiter)
	})
	if abandoned {
		a.failed(err, true)
		return false, 0, err
	}
	s.end()
	if err != nil {
		a.failed(err, false)
		return false, 0, redisError(err)
	}
	if len(res) > 2 && res[2] > 0 {
		s.size.Store(res[2])
	}
	switch res[0] {
	case 1:
		return a.granted(ctx, a.n, res[1], sent, s.cfg.holdLease())
	case -1:
		s.lose(h)
		return false, 0, ErrLockLost
	case -2:
		return false, 0, fmt.Errorf("%w: %d is more than the size %d stored in Redis", ErrInvalidPermits, a.n, res[1])
	case -3, -4:
		// The call left the queue (granted, and lost since; or dropped
		// as dead), its id was withdrawn (by a retry of the attempt that
		// found so), or the holding it adds to ended meanwhile: go on as
		// a new call, so that a grant to the old one still on its way is
		// not taken for a new grant.
		a.left()
		if a.onto != nil && s.current() != a.onto {
			a.onto, a.holder = nil, s.c.ticket(s.cfg.label)
		}
		a.waiter = s.nextWaiter(a.holder)
		return false, 0, nil
	}
	if a.mode == "queue" {
		a.joined(sent)
	}
	if a.more = res[1] == 0; a.more {
		return false, 0, nil
	}
	return false, s.sleepFor(res[1]), nil
}

// granted records n permits granted to the call with the fencing token
// token (a RWMutex's write; else 0), their lease of length lease set no
// earlier than since. When s cannot take them they are given back: if
// their lease may have run out already, the call goes on waiting.
func (a *acquireCall) granted(ctx context.Context, n, token int64, since time.Time, lease time.Duration) (bool, time.Duration, error) {
	s := a.s
	s.mu.Lock()
	if h := s.cur; h != nil {
		if h != a.onto || h.isLost {
			// The holding these permits were added to was lost
			// meanwhile: give them back.
			s.mu.Unlock()
			a.giveBack(ctx)
			return false, 0, ErrLockLost
		}
		h.n += n
		if token != 0 {
			h.token = token
		}
		s.mu.Unlock()
		noteHold(ctx, &s.holds, h)
		if lease >= s.cfg.holdLease() { // a shorter grant lease did not shorten it
			s.c.wd.Rearm(h.ka, since)
		}
		a.left()
		return true, 0, nil
	}
	if a.onto != nil && !a.onto.freed {
		// The holding the call added to ended, and Redis may count
		// some of its permits still, with these, under its id: give
		// these back and go on as a call of a new holding, leaving
		// those to run out unrenewed.
		s.mu.Unlock()
		a.giveBack(ctx)
		a.anew(ctx)
		return false, 0, nil
	}
	s.mu.Unlock()
	// A copy of a call of the holding may still be on its way: its release
	// refuses the id (sem_release.lua).
	h := &hold{id: a.holder, n: n, token: token, refuse: a.unsure || a.abandoned}
	e := &watchdog.Entry{Kind: "sem", Owner: a.holder, Keys: semKeys(s.keys), TTL: s.cfg.holdLease(),
		Hold: true, Renew: s.cfg.lease == 0, Release: func(ctx context.Context) error { return s.releaseAll(ctx, h) }}
	if s.cfg.maxHold > 0 {
		e.Until = since.Add(s.cfg.maxHold)
	}
	err := s.holds.take(ctx, h, e, since, lease, false)
	if err == nil {
		a.left()
		return true, 0, nil
	}
	a.giveBack(ctx)
	if errors.Is(err, errExpired) {
		// Attempt again at once, as a new call: the withdrawal of this
		// one refuses its id from now on.
		a.waiter = s.nextWaiter(a.holder)
		return false, 0, nil
	}
	return false, 0, err
}

// adopt takes the permits that a release granted to the call, announced
// by the message grant ("waiter:permits:ms", or "waiter:token:ms" for a
// RWMutex's write). Their grant lease was set after the last call that
// Redis ran before the grant was sent (see place.confirmed).
func (a *acquireCall) adopt(ctx context.Context, grant string) (bool, error) {
	n, ms, ours := parseGrant(grant, a.waiter)
	if n == 0 {
		// Not a grant: the script that sent it stopped at its bound
		// with the call at the queue's head, and the attempt serves
		// the queue on.
		return false, nil
	}
	var token int64
	if a.s.fence && a.n == a.s.Size() {
		n, token = a.n, n
	}
	if !ours || n != a.n || a.s.cfg.replicas > 0 || (a.onto != nil && a.s.current() != a.onto) {
		// Not a grant of this call, one to confirm with the replicas,
		// or one to the holding of the value that ended meanwhile
		// (whether its release was confirmed is known once the value's
		// turn to talk to Redis is free): the attempt will tell, and take
		// it if it is ours.
		return false, nil
	}
	ok, _, err := a.granted(ctx, n, token, a.confirmed(ms), a.s.cfg.grantLease())
	return ok, err
}

// outlasts: a waiting call outlives Redis restarting or failing over.
func (a *acquireCall) outlasts(err error) bool { return a.s.c.rt.Outlasts(err) }

// sleeping keeps a queued call alive while it sleeps.
func (a *acquireCall) sleeping(ws *waiters.Set) {
	s := a.s
	a.keepAlive("swait", a.waiter, s.name, semKeys(s.keys), s.cfg.heartbeat, s.cfg.grantLease(), ws)
}

// finish ends the call: it stops the heartbeat and, when the call failed
// after sending something that may have queued it or granted it permits,
// withdraws it and gives back what was granted to it meanwhile. An
// abandoned attempt's late reply does that instead.
func (a *acquireCall) finish(ctx context.Context, err error) {
	if a.mustWithdraw(err) {
		a.giveBack(ctx)
	}
	a.stop()
}

// giveBack withdraws the call: it leaves the queue, gives back the permits
// granted to it but not taken by s, and its id is refused from then on (a
// copy of one of its calls still on its way takes nothing). It waits for
// it at most roundtrip.CleanupWait.
func (a *acquireCall) giveBack(ctx context.Context) {
	s, holder, n, waiter := a.s, a.holder, a.n, a.waiter
	s.c.rt.Cleanup(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		if err := s.lockOp(ctx); err != nil {
			return nil, err
		}
		defer s.end()
		s.withdraw(ctx, rdb, holder, n, waiter)
		return nil, nil
	})
	a.left()
}

// anew makes the call one of a new holding, under a new id: it withdraws
// its waiter id first, giving back what was granted to it, if an attempt
// may have queued it.
func (a *acquireCall) anew(ctx context.Context) {
	if a.queued || a.unsure {
		a.giveBack(ctx)
	}
	a.onto, a.holder = nil, a.s.c.ticket(a.s.cfg.label)
	a.waiter = a.s.nextWaiter(a.holder)
}

// address returns the call's waiter id: its address in grant messages.
func (a *acquireCall) address() string { return a.waiter }
