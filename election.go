package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/schema"
)

// Errors of an Election.
var (
	// ErrNotLeader is returned by Proclaim and Resign when the Election
	// does not lead: it has not won a campaign, or resigned since. The
	// error is ErrNotHeld too (errors.Is), as every primitive's call that
	// needs a hold when there is none.
	ErrNotLeader = errors.New("redisync: not the leader")
	// ErrNoLeader is returned by Leader when the election has no leader.
	ErrNoLeader = errors.New("redisync: no leader")
	// ErrInvalidValue is returned, before any call to Redis, for a
	// leader's value longer than MaxMetadataLen bytes.
	ErrInvalidValue = invalid("redisync: invalid value")
)

// Election is leader election among every process that uses the same
// election name and key prefix on the same Redis, with the semantics of
// etcd's concurrency.Election: Campaign blocks until this candidate leads,
// candidates being served in the order they arrived; Proclaim changes the
// leader's value; Resign gives up leadership; Leader reads who leads; and
// Observe streams every change of leader.
//
// Leading is holding the election's lock: a fair Mutex (see Mutex) whose
// hold stores the leader's value as its metadata. The leader has what a
// holder has: a lease renewed by the watchdog, a fencing token (Token)
// that every new leader gets larger than the last, Lost, closed when the
// leadership is lost, and HoldContext. A leader that crashes or pauses
// past its lease is replaced by the next candidate within the lease; one
// that pauses knows it lost leadership by its local deadline (Lost), but
// only a resource that rejects old fencing tokens is safe from what it
// does after waking: see docs/guarantees.md.
//
// An Election value is used as a Mutex is: goroutines that share it are
// candidates each, served in arrival order like those of other values and
// processes. A Campaign made with a context of the value's leadership
// (HoldContext) changes its value, as Proclaim does; any other Campaign
// of the value, while it leads, waits its turn as a candidate, until the
// leadership ends (Resign, or lost) and it is served. It is safe for
// concurrent use.
//
// Make an Election with Client.NewElection: every call of a zero Election
// fails with ErrInvalid.
type Election struct {
	c    *Client
	name string
	m    Mutex // the election's lock: its hold is the leadership
	// proclaims numbers the Proclaims, so that Redis applies none after a
	// later one (see scripts/proclaim.lua).
	proclaims atomic.Int64
}

// Leadership is a state of an election: who leads, as Leader read it or
// Observe reported it.
type Leadership struct {
	// Value is the leader's value, given to Campaign or Proclaim.
	Value string
	// Token is the leader's fencing token; 0 when nobody leads.
	Token int64
	// Revision numbers the changes of the election: each change of leader
	// or of its value has a larger one than the change before (see
	// docs/guarantees.md); 0 when no change was made for an hour.
	Revision int64
	// Gap is set by Observe on a state read at once after changes may
	// have been missed (a message lost, the subscription renewed after a
	// reconnect, or the observer too slow to keep up): the changes
	// between the one reported before and this one are not reported.
	Gap bool
}

// Leads reports whether somebody leads.
func (l Leadership) Leads() bool { return l.Token != 0 }

// NewElection returns the candidate of this process in the election
// called name. It does no I/O. It fails with an *OpError wrapping
// ErrInvalidName or ErrInvalidOption (and ErrInvalid) for an invalid name
// or option. A Client's Barging does not apply: candidates are always
// served in order.
//
// The election's keys and channels share the hash tag {name}, so that they
// live in one Redis Cluster slot; they are not a Mutex's of the same name.
func (c *Client) NewElection(name string, opts ...Option) (*Election, error) {
	cfg := with(c.cfg, atElection, opts)
	if err := cmp.Or(checkName(name), cfg.err); err != nil {
		return nil, wrapOp("new election", name, err)
	}
	cfg.barging, cfg.metadata = false, ""
	e := &Election{c: c, name: name}
	c.initMutex(&e.m, name, cfg)
	e.m.keys, e.m.prim, e.m.holds.prim = schema.ElectionKeys(cfg.prefix, name), PrimitiveElection, PrimitiveElection
	return e, nil
}

// Campaign blocks until this call leads the election with value, ctx
// ends or the Client is closed. When ctx carries e's leadership (from
// HoldContext), it changes the leader's value instead, as Proclaim does.
// A leadership that was lost stays e's until its Resign (which returns
// ErrLockLost), as a Mutex's lost hold stays until its Unlock: a Campaign
// waits for that Resign before it joins the candidates (holding nothing in
// Redis meanwhile), so that the Resign owed to the lost leadership never
// resigns a later one. A candidate that lost its leadership resigns it
// before it campaigns again; otherwise its Campaign waits until its ctx
// ends.
// Candidates are served in the order they arrived, across all processes:
// Campaign waits as a fair Mutex's Lock does, woken by a message, not by
// polling, and leaves nothing behind when ctx ends first. A value is at
// most MaxMetadataLen bytes (ErrInvalidValue). Campaign returns ctx's
// error, ErrClosed and the errors of Redis as Mutex.Lock does. It is safe
// for concurrent use.
func (e *Election) Campaign(ctx context.Context, value string) error {
	if h := holdIn(ctx, &e.m.holds); h != nil {
		if e.isLost(h) { // before ctx, which ends with the leadership
			return wrapOp("campaign", e.name, ErrLockLost)
		}
		if err := e.usable(ctx, value); err != nil {
			return wrapOp("campaign", e.name, err)
		}
		return e.proclaim(ctx, h, value)
	}
	return observed(e.c.observer(), ctx, CallInfo{Op: OpLock, Primitive: PrimitiveElection, Name: e.name}, func(ctx context.Context) error {
		return e.campaign(ctx, value)
	}, e.m.Token)
}

// campaign is Campaign as a candidate, unobserved.
func (e *Election) campaign(ctx context.Context, value string) error {
	if err := e.usable(ctx, value); err != nil {
		return wrapOp("campaign", e.name, err)
	}
	m := &e.m
	leave, err := m.c.enter(ctx, m.keys.GrantChannel(m.c.id))
	if err != nil {
		return wrapOp("campaign", e.name, err)
	}
	defer leave()
	if err := m.owedUnlock(ctx, true); err != nil {
		return m.wrap("campaign", err)
	}
	ctx, stop := roundtrip.Marked(ctx)
	defer stop()
	l := m.newCall("queue")
	l.waits, l.meta = true, value
	return m.wrapIf("campaign", block(ctx, []post{m.post()}, l))
}

// TryCampaign makes one attempt to lead the election with value, without
// waiting: it reports true when this call leads, and false at once,
// leaving nothing queued, when another candidate leads or candidates wait
// their turn (they were first). When ctx carries e's leadership (from
// HoldContext), it changes the leader's value, as Campaign does, and
// reports true. It reports false while a lost leadership of e still owes
// its Resign. Errors are Campaign's. It is safe for concurrent use.
func (e *Election) TryCampaign(ctx context.Context, value string) (bool, error) {
	return observedTry(e.c.observer(), ctx, CallInfo{Op: OpTryLock, Primitive: PrimitiveElection, Name: e.name}, func(ctx context.Context) (bool, error) {
		return e.tryCampaign(ctx, value)
	}, e.m.Token)
}

// tryCampaign is TryCampaign, unobserved: one attempt in the mode of a
// fair TryLock, which never queues, with value as the hold's metadata.
func (e *Election) tryCampaign(ctx context.Context, value string) (bool, error) {
	if h := holdIn(ctx, &e.m.holds); h != nil {
		if e.isLost(h) {
			return false, wrapOp("trycampaign", e.name, ErrLockLost)
		}
		if err := e.usable(ctx, value); err != nil {
			return false, wrapOp("trycampaign", e.name, err)
		}
		err := e.proclaim(ctx, h, value)
		return err == nil, err
	}
	if err := e.usable(ctx, value); err != nil {
		return false, wrapOp("trycampaign", e.name, err)
	}
	m := &e.m
	leave, err := m.c.enter(ctx, m.keys.GrantChannel(m.c.id))
	if err != nil {
		return false, wrapOp("trycampaign", e.name, err)
	}
	defer leave()
	if m.owedUnlock(ctx, false) != nil {
		return false, nil // a lost leadership of e still owes its Resign
	}
	ctx, stop := roundtrip.Marked(ctx)
	defer stop()
	l := m.newCall("try")
	l.meta = value
	ok, _, err := l.attempt(ctx)
	if err != nil || !ok {
		l.finish(ctx, err)
	}
	return ok, m.wrapIf("trycampaign", err)
}

// Proclaim changes the value of e's leadership without giving it up:
// Leader and Observe report the new value. It returns ErrNotLeader when e
// does not lead, and ErrLockLost when its leadership was lost (Lost is
// closed then, if it was not already). A value that is e's already
// changes nothing. It is safe for concurrent use.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	return observed(e.c.observer(), ctx, CallInfo{Op: OpProclaim, Primitive: PrimitiveElection, Name: e.name}, func(ctx context.Context) error { return e.proclaimValue(ctx, value) }, nil)
}

// proclaimValue is Proclaim, unobserved.
func (e *Election) proclaimValue(ctx context.Context, value string) error {
	if err := e.usable(ctx, value); err != nil {
		return wrapOp("proclaim", e.name, err)
	}
	h := e.m.current()
	switch {
	case h == nil:
		return wrapOp("proclaim", e.name, notHeldToo(ErrNotLeader))
	case e.isLost(h):
		return wrapOp("proclaim", e.name, ErrLockLost)
	}
	return e.proclaim(ctx, h, value)
}

// proclaim sets the value of h, e's leadership. A hold found gone is
// lost, unless e resigned it meanwhile.
func (e *Election) proclaim(ctx context.Context, h *hold, value string) error {
	m := &e.m
	proclaim := proclaimArgs{id: h.id, value: value, publish: e.c.publish, seq: e.proclaims.Add(1)}.call(m.keys)
	res, _, err := e.c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		n, err := proclaim.run(ctx, rdb).Int64()
		return []int64{n}, err
	}, nil)
	switch {
	case err != nil:
		return wrapOp("proclaim", e.name, redisError(err))
	case res[0] == 0 && m.current() != h:
		return wrapOp("proclaim", e.name, notHeldToo(ErrNotLeader)) // resigned meanwhile
	case res[0] == 0:
		m.lose(h)
		return wrapOp("proclaim", e.name, ErrLockLost)
	}
	return nil
}

// Resign gives up e's leadership: the next candidate, if any, leads at
// once (in the same script), and observers are told. It returns
// ErrNotLeader when e does not lead, and ErrLockLost when its leadership
// had been lost already; otherwise as Mutex.Unlock, whose release is sent
// even when ctx has ended.
func (e *Election) Resign(ctx context.Context) error {
	if err := e.c.made(); err != nil {
		return wrapOp("resign", e.name, err)
	}
	err := e.m.Unlock(ctx)
	if errors.Is(err, ErrNotHeld) {
		return wrapOp("resign", e.name, notHeldToo(ErrNotLeader))
	}
	return err
}

// Do campaigns with value (see Campaign), runs fn with a context of the
// leadership (see HoldContext), and resigns after fn, even when fn fails,
// panics (the panic goes on once Resign returned) or the leadership is
// lost: it returns fn's error joined with Resign's (ErrLockLost when the
// leadership was lost meanwhile). When ctx carries e's leadership already
// (a Do inside a Do of e), Do changes its value, as Campaign does, and
// runs fn inside it: the inner Do does not resign it. When Campaign fails,
// fn does not run and Do returns Campaign's error.
func (e *Election) Do(ctx context.Context, value string, fn func(ctx context.Context) error) error {
	campaign := func(ctx context.Context) error {
		if err := e.Campaign(ctx, value); err != nil {
			return err
		}
		if holdIn(ctx, &e.m.holds) != nil {
			return e.m.lock(ctx) // a level of the leadership, for Resign to end
		}
		return nil
	}
	return do(ctx, &e.m.holds, &e.m.mu, campaign, e.Resign, fn)
}

// Leader reads who leads the election, in one round trip: the leader's
// value, fencing token and the election's revision. It returns ErrNoLeader
// when nobody leads. It is safe for concurrent use.
func (e *Election) Leader(ctx context.Context) (Leadership, error) {
	var l Leadership
	err := observed(e.c.observer(), ctx, CallInfo{Op: OpLeader, Primitive: PrimitiveElection, Name: e.name}, func(ctx context.Context) (err error) {
		l, err = e.leader(ctx)
		return err
	}, nil)
	return l, err
}

// leader is Leader, unobserved.
func (e *Election) leader(ctx context.Context) (Leadership, error) {
	if err := cmp.Or(e.c.usable(), ctx.Err()); err != nil {
		return Leadership{}, wrapOp("leader", e.name, err)
	}
	l, _, err := e.read(ctx)
	switch {
	case err != nil:
		return Leadership{}, wrapOp("leader", e.name, err)
	case !l.Leads():
		return l, wrapOp("leader", e.name, ErrNoLeader)
	}
	return l, nil
}

// read reads the election's state at one instant: its leader's value and
// token (none when the lock is free), and its revision; and the leader's
// remaining lease (0: nobody leads).
func (e *Election) read(ctx context.Context) (Leadership, time.Duration, error) {
	var l Leadership
	var lease time.Duration
	leader := leaderCall(e.m.keys)
	_, _, err := e.c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		res, err := leader.run(ctx, rdb).StringSlice()
		if err != nil {
			return nil, redisError(err)
		}
		return nil, e.parse(res, &l, &lease)
	}, nil)
	if err != nil {
		return Leadership{}, 0, err
	}
	return l, lease, nil
}

// parse decodes leader.lua's reply into l and lease.
func (e *Election) parse(res []string, l *Leadership, lease *time.Duration) error {
	if len(res) != 4 {
		return fmt.Errorf("redisync: unexpected reply %q from the leader script", res)
	}
	ms, err := strconv.ParseInt(res[3], 10, 64)
	if err != nil {
		return fmt.Errorf("redisync: unexpected reply %q from the leader script", res)
	}
	*lease = time.Duration(ms) * time.Millisecond
	if l.Revision, err = strconv.ParseInt(res[0], 10, 64); err != nil {
		return fmt.Errorf("redisync: unexpected reply %q from the leader script", res)
	}
	if l.Token, err = strconv.ParseInt(res[1], 10, 64); err != nil {
		return fmt.Errorf("redisync: unexpected reply %q from the leader script", res)
	}
	l.Value = res[2]
	return nil
}

// Token returns the fencing token of e's leadership, or 0 when e does not
// lead. Every new leader's token is larger than the last's.
func (e *Election) Token() int64 { return e.m.Token() }

// Lost returns a channel that is closed when e's leadership is lost, as
// Mutex.Lost for a hold. Resign does not close the channel of the
// leadership it ends; once e does not lead, Lost returns a closed
// channel.
func (e *Election) Lost() <-chan struct{} { return e.m.Lost() }

// HoldContext returns a context, derived from parent, that is cancelled
// the moment e's leadership ends, with cause ErrLockLost when it was lost
// and ErrReleased when e resigned; when e does not lead, it is cancelled
// already, with cause ErrNotHeld. A Campaign with it changes the value of
// the leadership. See Mutex.HoldContext.
func (e *Election) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return e.m.HoldContext(parent)
}

// Name returns the name of the election.
func (e *Election) Name() string { return e.name }

// isLost reports whether h, e's leadership, was lost.
func (e *Election) isLost(h *hold) bool {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	return h.isLost
}

// usable checks, before any call to Redis, that e can campaign or proclaim
// value now.
func (e *Election) usable(ctx context.Context, value string) error {
	if len(value) > MaxMetadataLen {
		return fmt.Errorf("%w: %d bytes is longer than %d", ErrInvalidValue, len(value), MaxMetadataLen)
	}
	return cmp.Or(e.c.usable(), ctx.Err())
}
