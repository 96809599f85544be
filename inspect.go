package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

// LockState is the state of a lock as InspectLock read it, at one instant.
type LockState struct {
	Name       string
	ServerTime time.Time   // the Redis server's clock at the instant read
	Holder     *LockHolder // nil when the lock is free
	// LastToken is the last fencing token issued: the holder's while the
	// lock is held; after it is released, remembered for an hour (0 once
	// forgotten).
	LastToken int64
	// Queue is the fair waiters, the next to be served first. Plain
	// (barging) waiters are not queued; their Clients are recorded, not
	// each waiter: see Subscribers.
	Queue []LockWaiter
	// Subscribers counts the processes subscribed to their grant channels
	// of the lock, where their waiters, fair or plain, are woken: those
	// with waiters, and those whose last waiter left less than 2 s ago
	// (and an older version's processes with plain waiters, subscribed
	// to the lock's channel). On a Redis Cluster, a process that
	// subscribes with plain pub/sub (WithPlainPubSub) may be connected to
	// any node, so every node is asked.
	Subscribers int64
	// Barging counts the Clients recorded as having plain (barging)
	// waiters, whose records have not run out: a release that hands the
	// lock to nobody wakes one of them.
	Barging int64
}

// Held reports whether the lock is held.
func (s *LockState) Held() bool { return s.Holder != nil }

// LockHolder is the holder of a lock.
type LockHolder struct {
	ID    string // the hold id: label "/" client id "-" number
	Label string // who holds, for people (see WithLabel)
	// Count is the hold count stored in Redis. A Mutex counts its
	// re-entries in its own process, without a round trip, so its holds
	// store 1 however often it re-entered.
	Count int64
	// Lease is the time left before the lock is released unless the holder
	// renews it; negative when the key has no expiry (not redisync's doing).
	Lease time.Duration
	Token int64 // the hold's fencing token
	// Metadata is what the holder stored with its hold (WithMetadata).
	Metadata string
}

// LockWaiter is a fair waiter of a lock: one blocked Lock call.
type LockWaiter struct {
	ID     string        // the call's ticket: label "/" client id "-" number
	Label  string        // whose call, for people (see WithLabel)
	Waited time.Duration // since it joined the queue, by the server's clock
	// Heartbeat is the time left before the waiter is skipped unless its
	// Client sends a heartbeat (one for all its waiters of the lock, every
	// third of WithWaiterTimeout); negative when overdue.
	Heartbeat time.Duration
	// HandoffLease is the lease of a hold handed to it, until its watchdog
	// takes over.
	HandoffLease time.Duration
	// Alive reports whether the next hand-off would serve it: false when
	// its heartbeat is overdue or it has no record (it will be skipped).
	Alive bool
	// Metadata is what a hold handed to it will store (WithMetadata).
	Metadata string
}

// SemaphoreState is the state of a semaphore as InspectSemaphore read it,
// at one instant.
type SemaphoreState struct {
	Name       string
	ServerTime time.Time // the Redis server's clock at the instant read
	// Size is the size stored while the semaphore is in use and an hour
	// after its last Acquire; 0 when none is stored.
	Size int64
	// InUse counts the permits held under a lease that has not ended.
	InUse   int64
	Holders []SemaphoreHolder // ordered by ID
	Queue   []SemaphoreWaiter // the next to be served first
	// Subscribers counts the processes subscribed to their grant channels
	// of the semaphore, as for a lock (LockState.Subscribers).
	Subscribers int64
}

// Available returns the permits that the next Acquire could take: the size
// less the permits in use, or 0.
func (s *SemaphoreState) Available() int64 { return max(s.Size-s.InUse, 0) }

// Empty reports whether nothing of the semaphore is stored: no size, no
// holder, no waiter.
func (s *SemaphoreState) Empty() bool {
	return s.Size == 0 && len(s.Holders) == 0 && len(s.Queue) == 0
}

// SemaphoreHolder is one holder of permits: a Semaphore value that holds
// some.
type SemaphoreHolder struct {
	ID      string // the holder id: label "/" client id "-" number
	Label   string // who holds, for people (see WithLabel)
	Permits int64
	// Lease is the time left before the permits return to the semaphore
	// unless the holder renews them; 0 or less: ended, reclaimed by the
	// semaphore's next call.
	Lease time.Duration
}

// SemaphoreWaiter is a queued waiter for permits: one blocked Acquire.
type SemaphoreWaiter struct {
	ID      string // the waiter id: the holder id, "#", the Acquire's number, "." and a random part
	Holder  string // the holder id of the Semaphore value that waits
	Label   string // whose call, for people (see WithLabel)
	Permits int64  // permits wanted
	Waited  time.Duration
	// Heartbeat, GrantLease and Alive are as for a lock's waiter
	// (LockWaiter's Heartbeat, HandoffLease and Alive).
	Heartbeat  time.Duration
	GrantLease time.Duration
	Alive      bool
}

// InspectLock reads the state of the lock called name: its holder, hold
// count, fencing token and remaining lease, and its fair queue in order.
// It only reads, in one round trip and one MULTI transaction, so that
// what it returns was true at one instant. opts name the lock's keys
// (WithKeyPrefix) as for NewMutex; other options do not matter. A key of
// another type than redisync writes is ErrWrongType.
func (c *Client) InspectLock(ctx context.Context, name string, opts ...Option) (*LockState, error) {
	cfg := with(c.cfg, atInspect, opts)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect lock", name, err)
	}
	return c.inspectLock(ctx, name, schema.LockKeys(cfg.prefix, name))
}

// inspectLock reads the state of the lock called name whose keys are k:
// a Mutex's, or an Election's (see InspectElection).
func (c *Client) inspectLock(ctx context.Context, name string, k schema.Lock) (*LockState, error) {
	var (
		hash    *redis.MapStringStringCmd
		pttl    *redis.DurationCmd
		queue   *redis.StringSliceCmd
		bargers *redis.ZSliceCmd
		now     *redis.TimeCmd
		subs    func(context.Context) (int64, error)
	)
	err := c.readAll(ctx, func(p redis.Pipeliner) {
		hash = p.HGetAll(ctx, k.Hash)
		pttl = p.PTTL(ctx, k.Hash)
		queue = p.LRange(ctx, k.Queue, 0, -1)
		bargers = p.ZRangeWithScores(ctx, k.Bargers, 0, -1)
		now = p.Time(ctx)
		subs = c.numSub(ctx, p, k.Channel)
	})
	if err != nil {
		return nil, wrapOp("inspect lock", name, err)
	}
	nsubs, err := subs(ctx)
	if err != nil {
		return nil, wrapOp("inspect lock", name, err)
	}
	lock, ok := schema.ParseLockState(hash.Val())
	if !ok {
		if st, ok := olderLock(name, hash.Val(), pttl.Val(), now.Val(), nsubs); ok {
			return st, nil
		}
		return nil, wrapOp("inspect lock", name, &wrongType{detail: k.Hash + " does not hold a lock of layout " + strconv.Itoa(schema.Layout)})
	}
	st := &LockState{Name: name, ServerTime: now.Val(), Subscribers: nsubs, Queue: []LockWaiter{}, LastToken: lock.Token}
	nowMS := st.ServerTime.UnixMilli()
	if lock.Held(nowMS) {
		st.Holder = &LockHolder{ID: lock.Owner, Label: schema.Label(lock.Owner), Count: 1,
			Lease: time.Duration(lock.End-nowMS) * time.Millisecond, Token: lock.Token, Metadata: lock.Meta}
	}
	for _, z := range bargers.Val() {
		if int64(z.Score) >= nowMS {
			st.Barging++
		}
	}
	for _, r := range queue.Val() {
		rec, ok := schema.ParseQueueRecord(r)
		if !ok {
			continue // not redisync's: the next hand-off drops it
		}
		w := LockWaiter{ID: rec.Ticket, Label: schema.Label(rec.Ticket), Waited: time.Duration(nowMS-rec.Joined) * time.Millisecond,
			HandoffLease: time.Duration(rec.Handoff) * time.Millisecond, Metadata: rec.Metadata}
		w.Heartbeat = msUntil(alive(rec.Deadline, hash.Val(), rec.Ticket), st.ServerTime)
		w.Alive = w.Heartbeat >= 0
		st.Queue = append(st.Queue, w)
	}
	return st, nil
}

// olderLock reads a lock's hash written by layout 1 or 2 (the hold id ->
// its count, with the lease as the key's TTL), so that an operator sees
// who holds during a rolling deploy; false when h is no such hash.
func olderLock(name string, h map[string]string, pttl time.Duration, now time.Time, nsubs int64) (*LockState, bool) {
	if l := h[schema.LayoutField]; l != "" && l != "2" {
		return nil, false
	}
	st := &LockState{Name: name, ServerTime: now, Subscribers: nsubs, Queue: []LockWaiter{}}
	for f, v := range h {
		if f == schema.LayoutField || f == schema.MetaField || f == schema.ProclaimField {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || st.Holder != nil {
			return nil, false
		}
		st.Holder = &LockHolder{ID: f, Label: schema.Label(f), Count: n, Lease: pttl, Metadata: h[schema.MetaField]}
	}
	return st, true
}

// InspectSemaphore reads the state of the semaphore called name: its
// size, the permits in use, its holders with their leases and its queue
// in order. It reads as InspectLock does; opts name the keys as for
// NewSemaphore. A semaphore never used, or idle for an hour, is Empty.
func (c *Client) InspectSemaphore(ctx context.Context, name string, opts ...Option) (*SemaphoreState, error) {
	cfg := with(c.cfg, atInspect, opts)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect semaphore", name, err)
	}
	return c.inspectSemaphore(ctx, name, schema.SemaphoreKeys(cfg.prefix, name))
}

// inspectSemaphore reads the semaphore called name whose keys are k.
func (c *Client) inspectSemaphore(ctx context.Context, name string, k schema.Semaphore) (*SemaphoreState, error) {
	var (
		holders, waiters *redis.MapStringStringCmd
		expiry, queue    *redis.ZSliceCmd
		size             *redis.StringCmd
		now              *redis.TimeCmd
		subs             func(context.Context) (int64, error)
	)
	err := c.readAll(ctx, func(p redis.Pipeliner) {
		holders = p.HGetAll(ctx, k.Holders)
		expiry = p.ZRangeWithScores(ctx, k.Expiry, 0, -1)
		size = p.Get(ctx, k.Size)
		queue = p.ZRangeWithScores(ctx, k.Queue, 0, -1)
		waiters = p.HGetAll(ctx, k.Waiters)
		now = p.Time(ctx)
		subs = c.numSub(ctx, p, k.Channel)
	})
	if err != nil {
		return nil, wrapOp("inspect semaphore", name, err)
	}
	nsubs, err := subs(ctx)
	if err != nil {
		return nil, wrapOp("inspect semaphore", name, err)
	}
	st := &SemaphoreState{Name: name, ServerTime: now.Val(), Subscribers: nsubs,
		Holders: []SemaphoreHolder{}, Queue: []SemaphoreWaiter{}}
	if v := size.Val(); v != "" {
		var ok bool
		if st.Size, _, ok = schema.ParseSemSize(v); !ok {
			return nil, wrapOp("inspect semaphore", name, &wrongType{detail: k.Size + " does not hold a size"})
		}
	}
	end := make(map[string]float64, len(expiry.Val()))
	for _, z := range expiry.Val() {
		end[fmt.Sprint(z.Member)] = z.Score
	}
	for id, v := range holders.Val() {
		if id == schema.SemUsedField {
			continue
		}
		rec, ok := schema.ParseSemHolder(v)
		if !ok {
			return nil, wrapOp("inspect semaphore", name, &wrongType{detail: k.Holders + " does not hold a holder record for " + id})
		}
		h := SemaphoreHolder{ID: id, Label: schema.Label(id), Permits: rec.Permits}
		if e, ok := end[id]; ok {
			h.Lease = msUntil(int64(e), st.ServerTime)
		}
		if h.Lease > 0 {
			st.InUse += h.Permits
		}
		st.Holders = append(st.Holders, h)
	}
	slices.SortFunc(st.Holders, func(a, b SemaphoreHolder) int { return strings.Compare(a.ID, b.ID) })
	nowUS := st.ServerTime.UnixMicro()
	for _, z := range queue.Val() {
		id := fmt.Sprint(z.Member)
		holder := id // a waiter id is "holder id#call.random"; a label may hold '#'
		if i := strings.LastIndexByte(id, '#'); i >= 0 {
			holder = id[:i]
		}
		w := SemaphoreWaiter{ID: id, Holder: holder, Label: schema.Label(holder), Waited: since(nowUS, z.Score)}
		if rec, ok := schema.ParseSemWaiter(waiters.Val()[id]); ok {
			w.Permits = rec.Permits
			w.Heartbeat = msUntil(alive(rec.Deadline, waiters.Val(), id), st.ServerTime)
			w.GrantLease = time.Duration(rec.Grant) * time.Millisecond
			w.Alive = w.Heartbeat >= 0
		}
		st.Queue = append(st.Queue, w)
	}
	return st, nil
}

// readAll runs the reads that queue queues in one MULTI transaction. A
// missing key is not an error (GET of one is redis.Nil); a key of another
// type is ErrWrongType.
func (c *Client) readAll(ctx context.Context, queue func(redis.Pipeliner)) error {
	cmds, err := c.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		queue(p)
		return nil
	})
	// The transaction's error is its first failed command's: look at each.
	for _, cmd := range cmds {
		cerr := cmd.Err()
		switch {
		case cerr == nil || errors.Is(cerr, redis.Nil):
		case strings.HasPrefix(cerr.Error(), "WRONGTYPE") && len(cmd.Args()) > 1:
			return &wrongType{detail: fmt.Sprint(cmd.Args()[1]) + " holds another type than redisync writes", err: cerr}
		default:
			return redisError(cerr)
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return redisError(err)
	}
	return nil
}

// numSub queues the count of the processes subscribed to channel, and
// returns the function that sums it once the transaction ran. On a Redis
// Cluster both ways are counted: the lock's users may subscribe sharded
// (the default) or not (WithPlainPubSub), whatever this Client does; a
// process subscribes one way only. Sharded subscribers are on the node
// that serves the channel's slot, counted in the transaction; a plain
// one may be on any node (PUBLISH reaches every node), so each is asked.
func (c *Client) numSub(ctx context.Context, p redis.Pipeliner, channel string) func(context.Context) (int64, error) {
	pattern := globEscape(channel) + ":*" // the grant channels (schema.Lock.GrantChannel)
	cc := c.cluster
	if cc == nil {
		plain, grants := p.PubSubNumSub(ctx, channel), p.PubSubChannels(ctx, pattern)
		return func(context.Context) (int64, error) {
			return plain.Val()[channel] + grantChannels(channel, grants.Val()), nil
		}
	}
	sharded, grants := p.PubSubShardNumSub(ctx, channel), p.PubSubShardChannels(ctx, pattern)
	return func(ctx context.Context) (int64, error) {
		var plain atomic.Int64
		err := cc.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			subs, err := node.PubSubNumSub(ctx, channel).Result()
			if err != nil {
				return err
			}
			names, err := node.PubSubChannels(ctx, pattern).Result()
			plain.Add(subs[channel] + grantChannels(channel, names))
			return err
		})
		if err != nil {
			return 0, redisError(err)
		}
		return plain.Load() + sharded.Val()[channel] + grantChannels(channel, grants.Val()), nil
	}
}

// grantChannels counts the grant channels of channel among names, which
// match channel + ":*": those that end with a client id, not the channels
// of another primitive whose name starts with this one's and "}:ch:".
func grantChannels(channel string, names []string) int64 {
	var n int64
	for _, name := range names {
		if !strings.ContainsAny(name[len(channel)+1:], ":{}") {
			n++
		}
	}
	return n
}

// globEscape escapes the characters of s that a Redis glob pattern gives
// a meaning to.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// since returns the time from a queue score (the server time in µs when a
// waiter joined; see scripts/lib.lua, join_queue) to nowUS, or 0 if the
// score is later, or is an arrival number written by layout 1.
func since(nowUS int64, score float64) time.Duration {
	const layout2 = 1e15 // 2001 in µs: a smaller score is an arrival number
	if score < layout2 {
		return 0
	}
	return max(time.Duration(nowUS-int64(score))*time.Microsecond, 0)
}

// alive returns until when (server time in ms) the waiter id is alive:
// its own deadline, or its Client's in the waiters hash when that is later
// (scripts/lib.lua, alive): a lock's hash, or a semaphore's waiters.
func alive(deadline int64, waiters map[string]string, id string) int64 {
	v, _, _ := strings.Cut(waiters[schema.ClientField(id)], ":") // "ms", or "ms:L" (scripts/renew.lua)
	if c, err := strconv.ParseInt(v, 10, 64); err == nil {
		return max(deadline, c)
	}
	return deadline
}

// msUntil returns the time from now to deadline, in ms by the server clock.
func msUntil(deadline int64, now time.Time) time.Duration {
	return time.Duration(deadline-now.UnixMilli()) * time.Millisecond
}
