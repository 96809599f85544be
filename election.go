package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Errors of an Election.
var (
	// ErrNotLeader is returned by Proclaim and Resign when the Election
	// does not lead: it has not won a campaign, or resigned since.
	ErrNotLeader = errors.New("redisync: not the leader")
	// ErrNoLeader is returned by Leader when the election has no leader.
	ErrNoLeader = errors.New("redisync: no leader")
	// ErrInvalidValue is returned, before any call to Redis, for a
	// leader's value longer than MaxMetadataLen bytes.
	ErrInvalidValue = errors.New("redisync: invalid value")
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
// An Election value is one candidate; it is safe for concurrent use, but
// its Campaign calls run one at a time.
type Election struct {
	c    *Client
	name string
	cfg  config
	keys schema.Lock
	err  error // invalid name or option

	turn turn       // held by the Campaign under way
	mu   sync.Mutex // guards m
	m    *Mutex     // the last won campaign's: its hold is the leadership
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
// called name. It does no I/O. An invalid name (ErrInvalidName) or option
// (ErrInvalidOption) is reported by every call of the Election, before any
// call to Redis. A Client's Barging does not apply: candidates are always
// served in order.
//
// The election's keys and channels share the hash tag {name}, so that they
// live in one Redis Cluster slot; they are not a Mutex's of the same name.
func (c *Client) NewElection(name string, opts ...ElectionOption) *Election {
	cfg := with(c.cfg, opts, ElectionOption.applyElection)
	cfg.barging, cfg.metadata = false, ""
	return &Election{c: c, name: name, cfg: cfg, keys: schema.ElectionKeys(cfg.prefix, name),
		err: cmp.Or(checkName(name), cfg.err), turn: newTurn()}
}

// Campaign blocks until e leads the election with value, ctx ends or the
// Client is closed; when e leads already, it changes its value (as
// Proclaim). Candidates are served in the order they arrived, across all
// processes: Campaign waits as a fair Mutex's Lock does, woken by a
// message, not by polling, and leaves nothing behind when ctx ends first.
// A value is at most MaxMetadataLen bytes (ErrInvalidValue). Campaign
// returns ctx's error, ErrClosed and the errors of Redis as Mutex.Lock
// does; when e leads already, what Proclaim returns (ErrNotLeader when a
// Resign ran meanwhile, ErrLockLost when the leadership was found lost). It is safe for concurrent use; the campaigns of one Election run
// one at a time.
func (e *Election) Campaign(ctx context.Context, value string) error {
	if err := e.usable(ctx, value); err != nil {
		return wrapOp("campaign", e.name, err)
	}
	if err := e.turn.take(ctx, nil); err != nil {
		return wrapOp("campaign", e.name, err)
	}
	defer e.turn.give()
	if old := e.mutex(); old != nil {
		if h := old.current(); h != nil {
			if !e.isLost(old, h) {
				return e.proclaim(ctx, old, h, value)
			}
			_ = old.Unlock(ctx) // ErrLockLost: drops the lost hold
		}
	}
	cfg := e.cfg
	cfg.metadata = value
	m := e.c.newMutex(e.name, cfg)
	m.keys, m.prim, m.holds.prim = e.keys, PrimitiveElection, PrimitiveElection
	if err := m.Lock(ctx); err != nil {
		return err
	}
	e.mu.Lock()
	e.m = m
	e.mu.Unlock()
	return nil
}

// Proclaim changes the value of e's leadership without giving it up:
// Leader and Observe report the new value. It returns ErrNotLeader when e
// does not lead, and ErrLockLost when its leadership was lost (Lost is
// closed then, if it was not already). A value that is e's already
// changes nothing. It is safe for concurrent use.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if err := e.usable(ctx, value); err != nil {
		return wrapOp("proclaim", e.name, err)
	}
	m := e.mutex()
	if m == nil {
		return wrapOp("proclaim", e.name, ErrNotLeader)
	}
	h := m.current()
	switch {
	case h == nil:
		return wrapOp("proclaim", e.name, ErrNotLeader)
	case e.isLost(m, h):
		return wrapOp("proclaim", e.name, ErrLockLost)
	}
	return e.proclaim(ctx, m, h, value)
}

// proclaim sets the value of h, m's hold. A hold found gone is lost,
// unless m resigned it meanwhile.
func (e *Election) proclaim(ctx context.Context, m *Mutex, h *hold, value string) error {
	proclaim := proclaimArgs{id: h.id, token: h.token, value: value, publish: e.c.publish, seq: e.proclaims.Add(1)}.call(e.keys)
	res, _, err := e.c.call(ctx, func(ctx context.Context) ([]int64, error) {
		n, err := proclaim.run(ctx, e.c.rdb).Int64()
		return []int64{n}, err
	}, nil)
	switch {
	case err != nil:
		return wrapOp("proclaim", e.name, redisError(err))
	case res[0] == 0 && m.current() != h:
		return wrapOp("proclaim", e.name, ErrNotLeader) // resigned meanwhile
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
	if err := cmp.Or(e.err, e.c.usable()); err != nil {
		return wrapOp("resign", e.name, err)
	}
	m := e.mutex()
	if m == nil {
		return wrapOp("resign", e.name, ErrNotLeader)
	}
	err := m.Unlock(ctx)
	if errors.Is(err, ErrNotHeld) {
		return wrapOp("resign", e.name, ErrNotLeader)
	}
	return err
}

// Leader reads who leads the election, in one round trip: the leader's
// value, fencing token and the election's revision. It returns ErrNoLeader
// when nobody leads. It is safe for concurrent use.
func (e *Election) Leader(ctx context.Context) (Leadership, error) {
	if err := cmp.Or(e.err, e.c.usable(), ctx.Err()); err != nil {
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
	leader := leaderCall(e.keys)
	_, _, err := e.c.call(ctx, func(ctx context.Context) ([]int64, error) {
		res, err := leader.run(ctx, e.c.rdb).StringSlice()
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
		return &wrongType{detail: e.keys.Revision + " does not hold a counter"}
	}
	if l.Token, err = strconv.ParseInt(res[1], 10, 64); err != nil {
		return &wrongType{detail: e.keys.Token + " does not hold a counter"}
	}
	l.Value = res[2]
	return nil
}

// Token returns the fencing token of e's leadership, or 0 when e does not
// lead. Every new leader's token is larger than the last's.
func (e *Election) Token() int64 {
	if m := e.mutex(); m != nil {
		return m.Token()
	}
	return 0
}

// Lost returns a channel that is closed when e's leadership is lost, as
// Mutex.Lost for a hold; nil when e does not lead. Resign does not close
// it.
func (e *Election) Lost() <-chan struct{} {
	if m := e.mutex(); m != nil {
		return m.Lost()
	}
	return nil
}

// HoldContext returns a context, derived from parent, that is cancelled
// the moment e's leadership ends, with cause ErrLockLost when it was lost
// and ErrReleased when e resigned; when e does not lead, it is cancelled
// already, with cause ErrNotHeld. See Mutex.HoldContext.
func (e *Election) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	if m := e.mutex(); m != nil {
		return m.HoldContext(parent)
	}
	ctx, cancel := context.WithCancelCause(parent)
	cancel(ErrNotHeld)
	return ctx, func() {}
}

// Name returns the name of the election.
func (e *Election) Name() string { return e.name }

// mutex returns the Mutex of e's last won campaign, or nil.
func (e *Election) mutex() *Mutex {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m
}

// isLost reports whether h, m's hold, was lost.
func (e *Election) isLost(m *Mutex, h *hold) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return h.isLost
}

// usable checks, before any call to Redis, that e can campaign or proclaim
// value now.
func (e *Election) usable(ctx context.Context, value string) error {
	if len(value) > MaxMetadataLen {
		return fmt.Errorf("%w: %d bytes is longer than %d", ErrInvalidValue, len(value), MaxMetadataLen)
	}
	return cmp.Or(e.err, e.c.usable(), ctx.Err())
}

// InspectElection reads the state of the election called name as
// InspectLock reads a lock's, in one transaction: the holder of its lock
// is the leader (LockHolder.Metadata is its value, Token its fencing
// token, Lease its remaining lease) and the lock's queue the candidates
// waiting, next first. opts name the election's keys (WithKeyPrefix) as
// for NewElection; other options do not matter.
func (c *Client) InspectElection(ctx context.Context, name string, opts ...ElectionOption) (*LockState, error) {
	cfg := with(c.cfg, opts, ElectionOption.applyElection)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect election", name, err)
	}
	return c.inspectLock(ctx, name, schema.ElectionKeys(cfg.prefix, name))
}
