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

// InspectPage bounds what one call of InspectLock, InspectElection,
// InspectSemaphore or InspectRWMutex reads of each list that others
// make grow: it returns at most the first InspectPage records of a queue,
// and of a semaphore's or read-write lock's holders, with the total count
// beside them (LockState.QueueLen, ElectionState.CandidatesLen,
// SemaphoreState.QueueLen and HoldersLen, RWMutexState.QueueLen and
// ReadersLen). Redis serves one command at a time, for every client of
// the server: an Inspect call's work there is bounded by a constant,
// however many waiters wait.
const InspectPage = 100

// LockState is the state of a lock as InspectLock read it, at one instant.
type LockState struct {
	Name       string
	ServerTime time.Time   // the Redis server's clock at the instant read
	Holder     *LockHolder // nil when the lock is free
	// LastToken is the last fencing token issued: the holder's while the
	// lock is held; after it is released, remembered for an hour (0 once
	// forgotten).
	LastToken int64
	// Queue is the fair waiters, the next to be served first: those of
	// the queue's first InspectPage records. Plain (barging) waiters are
	// not queued; their Clients are recorded, not each waiter: see
	// Subscribers.
	Queue []LockWaiter
	// QueueLen counts the records in the queue, all of them: more than
	// len(Queue) when the queue is longer than InspectPage. It counts
	// the records that the next hand-offs will drop too: those of dead
	// waiters (in Queue, not Alive) and those that are not redisync's
	// (left out of Queue).
	QueueLen int
	// Subscribers counts the processes subscribed to their grant channels
	// of the lock, where their waiters, fair or plain, are woken: those
	// of the Clients of the waiters in Queue and of the first InspectPage
	// Clients recorded as barging (and an older version's processes with
	// plain waiters, subscribed to the lock's channel). Each channel is
	// asked by name (PUBSUB NUMSUB), not found among the server's
	// channels, whose number no bound limits. On a Redis Cluster, a
	// process that subscribes with plain pub/sub (WithPlainPubSub) may be
	// connected to any node, so every node is asked.
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
	// When the semaphore has more holders than InspectPage, it is the
	// count of permits in use that the semaphore stores, less those of
	// the listed holders whose lease ended (the holders whose lease ends
	// first are listed); a semaphore written by an older version, which
	// stores no such count, counts the listed holders' permits only.
	InUse int64
	// Holders is the holders, ordered by ID: all of them, or, when there
	// are more than InspectPage, the InspectPage whose leases end first.
	Holders []SemaphoreHolder
	// HoldersLen counts the holders, all of them.
	HoldersLen int
	// Queue is the waiters, the next to be served first: the first
	// InspectPage of them.
	Queue []SemaphoreWaiter
	// QueueLen counts the waiters, all of them.
	QueueLen int
	// Subscribers counts the processes subscribed to their grant channels
	// of the semaphore, as for a lock (LockState.Subscribers): those of
	// the Clients of the waiters in Queue.
	Subscribers int64
}

// Available returns the permits that the next Acquire could take: the size
// less the permits in use, or 0.
func (s *SemaphoreState) Available() int64 { return max(s.Size-s.InUse, 0) }

// Empty reports whether nothing of the semaphore is stored: no size, no
// holder, no waiter.
func (s *SemaphoreState) Empty() bool {
	return s.Size == 0 && s.HoldersLen == 0 && s.QueueLen == 0 && len(s.Holders) == 0 && len(s.Queue) == 0
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

// InspectLock reads the state of the lock called name: its holder with
// its fencing token, metadata and remaining lease, and the first
// InspectPage records of its fair queue in order, with the queue's
// length. It only reads, in one MULTI transaction, so that what it
// returns was true at one instant; with waiters queued, in two (rarely
// more): the first finds which Clients' records the page needs, the
// second reads them with the rest. Each reads a bounded part of the
// lock's keys (see InspectPage). Only WithKeyPrefix applies to it, naming
// the lock's keys as for NewMutex; any other option is ErrInvalidOption.
// A key of another type than redisync writes is ErrWrongType.
func (c *Client) InspectLock(ctx context.Context, name string, opts ...Option) (*LockState, error) {
	cfg := with(c.cfg, atInspect, opts)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect lock", name, err)
	}
	st, err := c.inspectLock(ctx, name, schema.LockKeys(cfg.prefix, name))
	if err != nil {
		return nil, wrapOp("inspect lock", name, err)
	}
	return st, nil
}

// inspectTries bounds the transactions of one Inspect call: each reads the
// records that the page of the one before named, and the call ends when
// its page names no other. A page that changed every time (the queue's
// head moving on by a page between transactions) is shown with the
// records read for it: a waiter whose Client's record was not read shows
// its own deadline only.
const inspectTries = 4

// lockFields are the fields of a lock's hash that InspectLock reads, before
// the Clients' fields of the waiters in its page.
var lockFields = []string{schema.LayoutField, schema.OwnerField, schema.EndField, schema.TokenField,
	schema.MetaField, schema.QueueField, schema.RevField}

// lockRead is what one transaction of InspectLock read.
type lockRead struct {
	fields  []string        // the hash's fields asked for: lockFields, then the page's Clients'
	values  *redis.SliceCmd // their values
	grants  []string        // the Clients whose grant channels' subscribers were counted
	hlen    *redis.IntCmd   // the hash's size
	queue   *redis.StringSliceCmd
	qlen    *redis.IntCmd
	bargers *redis.ZSliceCmd // the first records of the Clients with plain waiters
	nbarg   *redis.IntCmd
	now     *redis.TimeCmd
	subs    func(context.Context) (int64, error)
}

// readLock reads, in one transaction, the lock whose keys are k: its hash's
// fixed fields and the Client fields clients, the first page of its queue
// and of its plain waiters' Clients, their lengths, and the subscribers
// of the grant channels of the Clients grants.
func (c *Client) readLock(ctx context.Context, k schema.Lock, clients, grants []string) (*lockRead, error) {
	r := &lockRead{fields: append(slices.Clip(lockFields), clients...), grants: grants}
	err := c.readAll(ctx, func(p redis.Pipeliner) {
		r.values = p.HMGet(ctx, k.Hash, r.fields...)
		r.hlen = p.HLen(ctx, k.Hash)
		r.queue = p.LRange(ctx, k.Queue, 0, InspectPage-1)
		r.qlen = p.LLen(ctx, k.Queue)
		r.bargers = p.ZRangeWithScores(ctx, k.Bargers, 0, InspectPage-1)
		r.nbarg = p.ZCard(ctx, k.Bargers)
		r.now = p.Time(ctx)
		r.subs = c.numSub(ctx, p, k.Channel, grants)
	})
	return r, err
}

// hash returns the fields of the lock's hash that r read, by name (a field
// absent from the hash is absent from the map).
func (r *lockRead) hash() map[string]string {
	return fieldMap(r.fields, r.values.Val())
}

// clients returns the Client fields that r's page of the queue needs, the
// Clients whose grant channels its pages name (of its queue and of its
// barging Clients), and whether r read them all.
func (r *lockRead) clients() (fields, grants []string, done bool) {
	for _, rec := range r.queue.Val() {
		if q, ok := schema.ParseQueueRecord(rec); ok {
			fields = append(fields, schema.ClientField(q.Ticket))
			grants = append(grants, schema.Client(q.Ticket))
		}
	}
	for _, z := range r.bargers.Val() {
		grants = append(grants, fmt.Sprint(z.Member))
	}
	fields, fdone := covered(fields, r.fields[len(lockFields):])
	grants, gdone := covered(grants, r.grants)
	return fields, grants, fdone && gdone
}

// inspectLock reads the state of the lock called name whose keys are k:
// a Mutex's, or the one under an Election (see InspectElection).
func (c *Client) inspectLock(ctx context.Context, name string, k schema.Lock) (*LockState, error) {
	var r *lockRead
	var clients, grants []string
	for range inspectTries {
		var err error
		if r, err = c.readLock(ctx, k, clients, grants); err != nil {
			return nil, err
		}
		var done bool
		if clients, grants, done = r.clients(); done {
			break
		}
	}
	nsubs, err := r.subs(ctx)
	if err != nil {
		return nil, err
	}
	h := r.hash()
	lock, ok := schema.ParseLockState(h)
	if h[schema.LayoutField] != strconv.Itoa(schema.Layout) && r.hlen.Val() > 0 {
		ok = false // layout 1 or 2 keeps its holder in a field of its own
	}
	if !ok {
		st, err := c.inspectOlderLock(ctx, k, r.hlen.Val(), nsubs)
		if err != nil {
			return nil, err
		}
		if st != nil {
			st.Name = name
			return st, nil
		}
		return nil, &wrongType{detail: k.Hash + " does not hold a lock of layout " + strconv.Itoa(schema.Layout)}
	}
	st := &LockState{Name: name, ServerTime: r.now.Val(), Subscribers: nsubs, Queue: []LockWaiter{},
		QueueLen: int(r.qlen.Val()), LastToken: lock.Token}
	nowMS := st.ServerTime.UnixMilli()
	if lock.Held(nowMS) {
		st.Holder = &LockHolder{ID: lock.Owner, Label: schema.Label(lock.Owner),
			Lease: time.Duration(lock.End-nowMS) * time.Millisecond, Token: lock.Token, Metadata: lock.Meta}
	}
	// The records that ran out come first (the zset is ordered by when
	// they run out); those past the page are counted as standing. Each
	// barging attempt drops the records that ran out, so a page of them
	// is rare.
	st.Barging = r.nbarg.Val() - int64(len(r.bargers.Val()))
	for _, z := range r.bargers.Val() {
		if int64(z.Score) >= nowMS {
			st.Barging++
		}
	}
	for _, rec := range r.queue.Val() {
		q, ok := schema.ParseQueueRecord(rec)
		if !ok {
			continue // not redisync's: the next hand-off drops it
		}
		w := LockWaiter{ID: q.Ticket, Label: schema.Label(q.Ticket), Waited: time.Duration(nowMS-q.Joined) * time.Millisecond,
			HandoffLease: time.Duration(q.Handoff) * time.Millisecond, Metadata: q.Metadata}
		w.Heartbeat = msUntil(alive(q.Deadline, h, q.Ticket), st.ServerTime)
		w.Alive = w.Heartbeat >= 0
		st.Queue = append(st.Queue, w)
	}
	return st, nil
}

// olderLockFields bounds the fields of a lock's hash written by layout 1
// or 2: the hold id, and the layout, metadata and Proclaim fields.
const olderLockFields = 4

// inspectOlderLock reads the lock whose keys are k and whose hash, of
// hlen fields, is not of this layout: the state of a hash written by
// layout 1 or 2, or nil when it is no such hash. Such a hash is read
// whole, which its size bounds.
func (c *Client) inspectOlderLock(ctx context.Context, k schema.Lock, hlen, nsubs int64) (*LockState, error) {
	if hlen > olderLockFields {
		return nil, nil
	}
	var (
		hash *redis.MapStringStringCmd
		pttl *redis.DurationCmd
		now  *redis.TimeCmd
	)
	err := c.readAll(ctx, func(p redis.Pipeliner) {
		hash = p.HGetAll(ctx, k.Hash) // at most olderLockFields a moment ago
		pttl = p.PTTL(ctx, k.Hash)
		now = p.Time(ctx)
	})
	if err != nil {
		return nil, err
	}
	if len(hash.Val()) > olderLockFields {
		return nil, nil
	}
	st, _ := olderLock(hash.Val(), pttl.Val(), now.Val(), nsubs)
	return st, nil
}

// olderLock reads a lock's hash written by layout 1 or 2 (the hold id ->
// its count, with the lease as the key's TTL), so that an operator sees
// who holds during a rolling deploy; false when h is no such hash.
func olderLock(h map[string]string, pttl time.Duration, now time.Time, nsubs int64) (*LockState, bool) {
	if l := h[schema.LayoutField]; l != "" && l != "2" {
		return nil, false
	}
	st := &LockState{ServerTime: now, Subscribers: nsubs, Queue: []LockWaiter{}}
	for f, v := range h {
		if f == schema.LayoutField || f == schema.MetaField || f == schema.ProclaimField {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 1 || st.Holder != nil {
			return nil, false
		}
		st.Holder = &LockHolder{ID: f, Label: schema.Label(f), Lease: pttl, Metadata: h[schema.MetaField]}
	}
	return st, true
}

// InspectSemaphore reads the state of the semaphore called name: its
// size, the permits in use, its holders with their leases and its queue
// in order, the first InspectPage of each with their counts. It reads as
// InspectLock does. Only WithKeyPrefix applies to it, naming the keys as
// for NewSemaphore; any other option is ErrInvalidOption. A semaphore
// never used, or idle for an hour, is Empty.
func (c *Client) InspectSemaphore(ctx context.Context, name string, opts ...Option) (*SemaphoreState, error) {
	cfg := with(c.cfg, atInspect, opts)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect semaphore", name, err)
	}
	st, err := c.inspectSemaphore(ctx, name, schema.SemaphoreKeys(cfg.prefix, name))
	if err != nil {
		return nil, wrapOp("inspect semaphore", name, err)
	}
	return st, nil
}

// semRead is what one transaction of InspectSemaphore read.
type semRead struct {
	own     *redis.SliceCmd  // schema.SemFields of the hash
	expiry  *redis.ZSliceCmd // the first holders by the end of their lease
	nexp    *redis.IntCmd    // the number of holders
	queue   *redis.ZSliceCmd
	qlen    *redis.IntCmd
	hids    []string        // the holders asked for
	holders *redis.SliceCmd // their records; nil when none was asked
	wids    []string        // the waiters and Client fields asked for
	waiters *redis.SliceCmd // their records; nil when none was asked
	grants  []string        // the Clients whose grant channels' subscribers were counted
	now     *redis.TimeCmd
	subs    func(context.Context) (int64, error)
}

// readSemaphore reads, in one transaction, the semaphore whose keys are k:
// its size, the first page of its holders and of its queue with their
// counts, the records of the holders hids and of the waiters (and Client
// fields) wids, and the subscribers of the grant channels of the Clients
// grants.
func (c *Client) readSemaphore(ctx context.Context, k schema.Semaphore, hids, wids, grants []string) (*semRead, error) {
	r := &semRead{hids: hids, wids: wids, grants: grants}
	err := c.readAll(ctx, func(p redis.Pipeliner) {
		r.own = p.HMGet(ctx, k.Hash, schema.SemFields...)
		r.expiry = p.ZRangeWithScores(ctx, k.Expiry, 0, InspectPage-1)
		r.nexp = p.ZCard(ctx, k.Expiry)
		r.queue = p.ZRangeWithScores(ctx, k.Queue, 0, InspectPage-1)
		r.qlen = p.ZCard(ctx, k.Queue)
		if len(hids) > 0 {
			r.holders = p.HMGet(ctx, k.Hash, hids...)
		}
		if len(wids) > 0 {
			r.waiters = p.HMGet(ctx, k.Hash, wids...)
		}
		r.now = p.Time(ctx)
		r.subs = c.numSub(ctx, p, k.Channel, grants)
	})
	return r, err
}

// records returns the holders and waiters (with their Clients' fields)
// that r's pages need, the Clients of the waiters, whose grant channels
// are counted, and whether r read them all.
func (r *semRead) records() (hids, wids, grants []string, done bool) {
	for _, z := range r.expiry.Val() {
		if id := fmt.Sprint(z.Member); !slices.Contains(schema.SemFields, id) {
			hids = append(hids, id)
		}
	}
	for _, z := range r.queue.Val() {
		id := fmt.Sprint(z.Member)
		wids = append(wids, id, schema.ClientField(id))
		grants = append(grants, schema.Client(id))
	}
	hids, hdone := covered(hids, r.hids)
	wids, wdone := covered(wids, r.wids)
	grants, gdone := covered(grants, r.grants)
	return hids, wids, grants, hdone && wdone && gdone
}

// inspectSemaphore reads the semaphore called name whose keys are k.
func (c *Client) inspectSemaphore(ctx context.Context, name string, k schema.Semaphore) (*SemaphoreState, error) {
	var r *semRead
	var hids, wids, grants []string
	for range inspectTries {
		var err error
		if r, err = c.readSemaphore(ctx, k, hids, wids, grants); err != nil {
			return nil, err
		}
		var done bool
		if hids, wids, grants, done = r.records(); done {
			break
		}
	}
	nsubs, err := r.subs(ctx)
	if err != nil {
		return nil, err
	}
	st := &SemaphoreState{Name: name, ServerTime: r.now.Val(), Subscribers: nsubs,
		Holders: []SemaphoreHolder{}, Queue: []SemaphoreWaiter{}, QueueLen: int(r.qlen.Val())}
	if v, ok := r.own.Val()[1].(string); ok {
		if st.Size, _, ok = schema.ParseSemSize(v); !ok {
			return nil, &wrongType{detail: k.Hash + " does not hold a size"}
		}
	}
	st.HoldersLen = int(r.nexp.Val())
	used, hasUsed := int64(0), false
	if v, ok := r.own.Val()[0].(string); ok {
		n, _, ok := schema.ParseSemUsed(v)
		if !ok {
			return nil, &wrongType{detail: k.Hash + " does not hold a count of permits in use"}
		}
		used, hasUsed = n, true
	}
	holders := fieldMap(r.hids, sliceVal(r.holders))
	var live, ended int64 // the listed holders' permits, by whether their lease ended
	for _, z := range r.expiry.Val() {
		id := fmt.Sprint(z.Member)
		v, ok := holders[id]
		if !ok || slices.Contains(schema.SemFields, id) {
			continue // released since it was listed, or not redisync's
		}
		rec, ok := schema.ParseSemHolder(v)
		if !ok {
			return nil, &wrongType{detail: k.Hash + " does not hold a holder record for " + id}
		}
		h := SemaphoreHolder{ID: id, Label: schema.Label(id), Permits: rec.Permits, Lease: msUntil(int64(z.Score), st.ServerTime)}
		if h.Lease > 0 {
			live += h.Permits
		} else {
			ended += h.Permits
		}
		st.Holders = append(st.Holders, h)
	}
	st.InUse = live
	if hasUsed && r.nexp.Val() > int64(len(r.expiry.Val())) {
		st.InUse = max(used-ended, live) // holders past the page: the stored count
	}
	slices.SortFunc(st.Holders, func(a, b SemaphoreHolder) int { return strings.Compare(a.ID, b.ID) })
	waiters := fieldMap(r.wids, sliceVal(r.waiters))
	nowUS := st.ServerTime.UnixMicro()
	for _, z := range r.queue.Val() {
		id := fmt.Sprint(z.Member)
		holder := id // a waiter id is "holder id#call.random"; a label may hold '#'
		if i := strings.LastIndexByte(id, '#'); i >= 0 {
			holder = id[:i]
		}
		w := SemaphoreWaiter{ID: id, Holder: holder, Label: schema.Label(holder), Waited: since(nowUS, z.Score)}
		if rec, ok := schema.ParseSemWaiter(waiters[id]); ok {
			w.Permits = rec.Permits
			w.Heartbeat = msUntil(alive(rec.Deadline, waiters, id), st.ServerTime)
			w.GrantLease = time.Duration(rec.Grant) * time.Millisecond
			w.Alive = w.Heartbeat >= 0
		}
		st.Queue = append(st.Queue, w)
	}
	return st, nil
}

// covered returns need sorted without repeats, and whether every one of
// them is in asked.
func covered(need, asked []string) ([]string, bool) {
	slices.Sort(need)
	need = slices.Compact(need)
	for _, f := range need {
		if !slices.Contains(asked, f) {
			return need, false
		}
	}
	return need, true
}

// fieldMap pairs the fields that an HMGET asked for with the values it
// returned, leaving out those absent.
func fieldMap(fields []string, values []any) map[string]string {
	m := make(map[string]string, len(fields))
	for i, v := range values {
		if s, ok := v.(string); ok && i < len(fields) {
			m[fields[i]] = s
		}
	}
	return m
}

// sliceVal returns the values of an HMGET, none when it was not sent.
func sliceVal(cmd *redis.SliceCmd) []any {
	if cmd == nil {
		return nil
	}
	return cmd.Val()
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

// numSub queues the count of the processes subscribed to channel and to
// the grant channels of the Clients clients (schema.Lock.GrantChannel), and
// returns the function that sums it once the transaction ran. Each
// channel is asked by name (PUBSUB NUMSUB), a bounded read, not looked for
// among the server's channels (PUBSUB CHANNELS reads them all, a cost that
// grows with every application's channels on the server). A grant channel
// counts once, however many connections of its process subscribe. On a
// Redis Cluster both ways are counted: the lock's users may subscribe
// sharded (the default) or not (WithPlainPubSub), whatever this Client
// does; a process subscribes one way only. Sharded subscribers are on the
// node that serves the channel's slot, counted in the transaction; a plain
// one may be on any node (PUBLISH reaches every node), so each is asked.
func (c *Client) numSub(ctx context.Context, p redis.Pipeliner, channel string, clients []string) func(context.Context) (int64, error) {
	names := make([]string, 0, 1+len(clients))
	names = append(names, channel)
	for _, id := range clients {
		names = append(names, channel+":"+id)
	}
	cc := c.cluster
	if cc == nil {
		plain := p.PubSubNumSub(ctx, names...)
		return func(context.Context) (int64, error) { return subscribers(channel, plain.Val()), nil }
	}
	sharded := p.PubSubShardNumSub(ctx, names...)
	return func(ctx context.Context) (int64, error) {
		var plain atomic.Int64
		err := cc.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			subs, err := node.PubSubNumSub(ctx, names...).Result()
			plain.Add(subscribers(channel, subs))
			return err
		})
		if err != nil {
			return 0, redisError(err)
		}
		return plain.Load() + subscribers(channel, sharded.Val()), nil
	}
}

// subscribers sums the processes in subs, the subscribers of channel and
// of grant channels: each subscriber of channel, and each grant channel
// with any.
func subscribers(channel string, subs map[string]int64) int64 {
	n := subs[channel]
	for name, k := range subs {
		if name != channel && k > 0 {
			n++
		}
	}
	return n
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
// its own deadline, or its Client's when that is later (scripts/lib.lua,
// alive), the Client's read from waiters, fields of a lock's or a semaphore's hash.
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
