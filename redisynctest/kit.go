package redisynctest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/kithook"
	"github.com/redisync/redisync/internal/schema"
)

// Kit is one test's embedded Redis and the redisync Clients on it. Make it
// with New; its methods are safe for concurrent use.
type Kit struct {
	tb  testing.TB
	mr  *miniredis.Miniredis
	rdb *redis.Client // the kit's own connection

	mu      sync.Mutex
	clients map[*redisync.Client]*member
	offset  time.Duration // how far Advance moved Redis's clock ahead of the real one
	manual  bool          // the clock is set by tick (Advance was called)
	set     time.Time     // the time last set on the clock, when manual
	stop    chan struct{} // closed when the test ends: tick returns
	wg      sync.WaitGroup
}

// member is a Client of the kit.
type member struct {
	id     string
	rdb    *redis.Client
	dialer *dialer
	killed bool
}

// New starts an embedded Redis for the test tb, whose clock follows real
// time, and returns its Kit. Everything the kit starts is stopped, and
// every Client it made is closed, when tb ends.
func New(tb testing.TB) *Kit {
	tb.Helper()
	warmOnce.Do(func() { warm(tb) })
	return start(tb)
}

// start starts a Kit for tb.
func start(tb testing.TB) *Kit {
	tb.Helper()
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		tb.Fatalf("redisynctest: cannot start the embedded Redis: %v", err)
	}
	// TTLs run out as the clock moves: the real one until Advance.
	mr.ClockTTL(true)
	k := &Kit{
		tb:      tb,
		mr:      mr,
		rdb:     redis.NewClient(&redis.Options{Addr: mr.Addr()}),
		clients: make(map[*redisync.Client]*member),
		stop:    make(chan struct{}),
	}
	// Its connection is dialed now, not by the first EndLease or Kill,
	// which must be prompt.
	if err := k.rdb.Ping(context.Background()).Err(); err != nil {
		_ = k.rdb.Close()
		mr.Close()
		tb.Fatalf("redisynctest: the embedded Redis does not answer: %v", err)
	}
	tb.Cleanup(func() {
		close(k.stop)
		k.wg.Wait()
		_ = k.rdb.Close()
		mr.Close()
	})
	return k
}

// warmOnce has the first New of a process warm up.
var warmOnce sync.Once

// warm runs once, on a Kit of its own, what a test does with the kit: a
// Client waits for a lock another holds, whose lease the kit ends. The
// first run of that in a process costs much more than the next ones (code
// run for the first time, memory touched for the first time: several
// milliseconds under the race detector), which would fall on the first
// test's EndLease or Kill. Its Clients are closed when tb ends.
func warm(tb testing.TB) {
	tb.Helper()
	k := start(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, b := k.Client(), k.Client()
	held, err := a.NewMutex("warm")
	if err != nil {
		return
	}
	waiting, err := b.NewMutex("warm")
	if err != nil || held.Lock(ctx) != nil {
		return
	}
	done := make(chan error, 1)
	go func() { done <- waiting.Lock(ctx) }()
	for ctx.Err() == nil {
		if q, _ := k.mr.List("redisync:lock:{warm}:waiting"); len(q) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond) // its last look before it sleeps
	k.EndLease("warm")
	if <-done == nil {
		_ = waiting.Unlock(ctx)
	}
	_ = held.Unlock(ctx)
	k.Kill(a)
}

// Addr returns the address of the embedded Redis, for a go-redis client
// of the test's own.
func (k *Kit) Addr() string { return k.mr.Addr() }

// Miniredis returns the embedded Redis, to look at or change what it
// stores. Its clock belongs to the kit: move it with Advance, not with
// miniredis's SetTime or FastForward.
func (k *Kit) Miniredis() *miniredis.Miniredis { return k.mr }

// Client returns a new redisync Client of the embedded Redis, with opts
// (redisync.New's options), on a go-redis client of its own. It is closed
// when the test ends. A Client that the test closes itself is closed
// again then, which does nothing.
func (k *Kit) Client(opts ...redisync.Option) *redisync.Client {
	k.tb.Helper()
	d := &dialer{conns: make(map[net.Conn]struct{})}
	rdb := redis.NewClient(&redis.Options{Addr: k.mr.Addr(), Dialer: d.dial})
	c, err := redisync.New(rdb, opts...)
	if err != nil {
		_ = rdb.Close()
		k.tb.Fatalf("redisynctest: %v", err)
	}
	m := &member{id: kithook.ID(c), rdb: rdb, dialer: d}
	k.mu.Lock()
	k.clients[c] = m
	k.mu.Unlock()
	k.tb.Cleanup(func() {
		k.mu.Lock()
		killed := m.killed
		k.mu.Unlock()
		if killed {
			// Its releases cannot reach Redis: no need to wait for them.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = c.Shutdown(ctx)
		}
		_ = c.Close()
		_ = rdb.Close()
	})
	return c
}

// Now returns the time on the embedded Redis's clock: the real time plus
// every Advance.
func (k *Kit) Now() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return time.Now().Add(k.offset)
}

// tickEvery is how often the clock is set once Advance has moved it.
const tickEvery = time.Millisecond

// Advance moves the embedded Redis's clock forward by d, at once, and
// keeps it d ahead of the real one from then on: leases, hand-offs and
// waiters' deadlines that end within d end now in Redis, as after a pause
// of the whole world but Redis. The holders of the locks whose leases
// ended are told at once (their Lost channels close); every other hold is
// renewed at once (one of a Semaphore or a RWMutex whose lease ended is
// found lost by the renewal's reply); and every waiter looks again (one
// finds a lease that ended and takes it).
//
// The Clients' own clocks do not move. A d of 0 or less does nothing.
func (k *Kit) Advance(d time.Duration) {
	k.tb.Helper()
	if d <= 0 {
		return
	}
	k.mu.Lock()
	k.offset += d
	k.setLocked()
	if !k.manual {
		k.manual = true
		k.wg.Add(1)
		go k.tick()
	}
	now := k.set.UnixMilli() // the Redis clock reads no earlier from now on
	byID := make(map[string]*redisync.Client)
	for c, m := range k.clients {
		if !m.killed {
			byID[m.id] = c
		}
	}
	k.mu.Unlock()
	ctx := context.Background()
	for _, key := range k.mr.Keys() {
		if !lockHash(key) || k.mr.Type(key) != "hash" {
			continue
		}
		v, err := k.rdb.HMGet(ctx, key, schema.OwnerField, schema.EndField).Result()
		if err != nil {
			k.tb.Fatalf("redisynctest: reading %s: %v", key, err)
			return
		}
		owner, _ := v[0].(string)
		e, _ := v[1].(string)
		// A hold whose lease has ended in Redis never comes back: no
		// script renews or takes again a hold past its end.
		if end, err := strconv.ParseInt(e, 10, 64); err == nil && owner != "" && end <= now {
			if c := byID[schema.Client(owner)]; c != nil {
				kithook.Lose(c, key, owner)
			}
		}
	}
	for _, c := range byID {
		kithook.RenewNow(c)
		kithook.WakeAll(c)
	}
}

// tick keeps the embedded Redis's clock the kit's offset ahead of the
// real one, from Advance until the test ends (miniredis has a clock that
// stands still, or the real one).
func (k *Kit) tick() {
	defer k.wg.Done()
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
			k.mu.Lock()
			k.setLocked()
			k.mu.Unlock()
		}
	}
}

// setLocked sets the embedded Redis's clock to the real time plus the
// offset. k.mu must be held.
func (k *Kit) setLocked() {
	k.set = time.Now().Add(k.offset)
	k.mr.SetTime(k.set)
}

// redisNow returns a time that the embedded Redis's clock has reached
// already: what it reads from now on is no earlier.
func (k *Kit) redisNow() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.manual {
		return k.set
	}
	return time.Now()
}

// EndLease ends, in the embedded Redis, the current hold of the lock
// called name (a Mutex's, or an Election's leader, under any key prefix),
// as if its lease had run out, and reports whether there was one. Its
// holder, when a Client of the kit, is told at once: its Lost channel
// closes (a holder whose Lock call has not returned yet learns it from a
// renewal sent at once). As a release would, the kit hands the lock to
// the first waiter of its fair queue that is alive, whose Lock returns
// then; when there is none (barging waiters, an election's candidates,
// a dead waiter at the head), it wakes every waiter of the lock on its
// Clients, and the first in line takes it. The holds of other locks, and
// of other holders, are left be.
func (k *Kit) EndLease(name string) bool {
	k.tb.Helper()
	var keys []string
	for _, key := range k.mr.Keys() {
		if lockHash(key) && (strings.HasSuffix(key, ":lock:{"+name+"}") || strings.HasSuffix(key, ":elect:{"+name+"}")) {
			keys = append(keys, key)
		}
	}
	return len(k.end(keys, "")) > 0
}

// Kill stands for the death of c's process: c's connections are cut and
// it dials no more, so that it renews nothing and releases nothing; every
// hold of c is reported lost at once (its Lost channels close), as the
// dead process would never learn it; and, as if their leases had run out,
// the kit ends c's holds of locks (Mutexes, MultiMutexes, Elections) in
// Redis, and only c's, handing each to its next waiter as EndLease does,
// so that other Clients take them without waiting for the crash timeout.
// c's calls fail from then on (it is closed when the test ends). c must be
// a Client of the kit.
//
// What else c left in Redis stays, as a dead process's would, until it
// runs out, or until Advance moves the clock past it: a hold that a Lock
// call of c was taking when c was killed (its lease), its queued waiters
// (their heartbeat: see redisync.WithWaiterTimeout; one at the head of a
// queue may be handed the lock, which then waits for its hand-off lease
// to run out), and its permits of a Semaphore or a RWMutex (their lease:
// see redisync.WithCrashTimeout).
func (k *Kit) Kill(c *redisync.Client) {
	k.tb.Helper()
	k.mu.Lock()
	m := k.clients[c]
	if m == nil {
		k.mu.Unlock()
		k.tb.Fatalf("redisynctest: Kill of a Client not made by this kit")
		return
	}
	already := m.killed
	m.killed = true
	k.mu.Unlock()
	if already {
		return
	}
	m.dialer.cut()
	keys, _ := kithook.DropHolds(c)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	k.end(keys, m.id)
}

// lockHash reports whether key may be a lock's (or an election's) hash,
// "prefix:lock:{name}" (internal/schema), by its name; end checks that it
// is a hash.
func lockHash(key string) bool {
	i := strings.IndexByte(key, '{')
	if i < 0 || !strings.HasSuffix(key, "}") {
		return false
	}
	return strings.HasSuffix(key[:i], ":lock:") || strings.HasSuffix(key[:i], ":elect:")
}

// end ends the holds of the locks whose hashes are keys, held by the
// Client client ("" for any), tells their holders that live, and wakes
// the waiters of the kit's live Clients on those locks. It returns the
// hashes whose hold it ended.
func (k *Kit) end(keys []string, client string) []string {
	k.tb.Helper()
	k.mu.Lock()
	byID := make(map[string]*redisync.Client)
	for c, m := range k.clients {
		if !m.killed {
			byID[m.id] = c
		}
	}
	k.mu.Unlock()
	var ended []string
	for _, key := range keys {
		owner, handed, err := k.endOne(key, client)
		if err != nil {
			k.tb.Fatalf("redisynctest: ending the lease of %s: %v", key, err)
			return nil
		}
		if owner == "" {
			continue
		}
		ended = append(ended, key)
		// The holder learns of it at once: the kit ended that very hold,
		// whose owner id no other hold has. A holder that does not know
		// the hold yet (its Lock call is still taking it) renews at once
		// instead: the reply tells it.
		if c := byID[schema.Client(owner)]; c != nil && !kithook.Lose(c, key, owner) {
			kithook.RenewNow(c)
		}
		if handed {
			continue // as a release does, to the waiter it handed the lock to
		}
		// Every Client's waiters look again, as the wake-up a release
		// publishes has them do (an empty message on the Client's grant
		// channel: internal/schema, Lock.GrantChannel): the first in line
		// takes the lock, or is handed it.
		for id, c := range byID {
			kithook.Wake(c, key+":ch:"+id)
		}
	}
	return ended
}

// stateMemory is how long a lock's hash outlives its last hold at least
// (scripts/lib.lua, state_memory_ms).
const stateMemory = time.Hour

// endOne ends the current hold of the lock whose hash is key, if it is
// held by the Client client ("" for any), as when a lease runs out: the
// end of its lease, in the hash's {end} field (scripts/lock_lib.lua),
// becomes the Redis clock's now, and the lock is free for the scripts from
// then on. When the head of the lock's fair queue is a waiter alive on its
// own, the lock is handed to it at once, as the next look of a waiter
// would (lock_lib.lua, hand_off): handed reports it, and the grant is
// published to the waiter, which takes it with no call to Redis. It all
// happens in one transaction, which reads what it needs in the process
// under WATCH (a write to the lock meanwhile fails it, and it looks
// again). It returns the owner whose hold it ended, "" for none.
func (k *Kit) endOne(key, client string) (owner string, handed bool, err error) {
	if k.mr.Type(key) != "hash" {
		return "", false, nil
	}
	ctx := context.Background()
	queue := key + ":waiting"
	for {
		owner, handed = "", false
		err = k.rdb.Watch(ctx, func(tx *redis.Tx) error {
			o := k.mr.HGet(key, schema.OwnerField)
			end, err := strconv.ParseInt(k.mr.HGet(key, schema.EndField), 10, 64)
			now := k.redisNow()
			ms := now.UnixMilli()
			if o == "" || err != nil || end <= ms || (client != "" && schema.Client(o) != client) {
				return nil
			}
			head, ok := k.handOff(key, queue, ms)
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				if !ok {
					p.HSet(ctx, key, schema.EndField, strconv.FormatInt(ms, 10))
					return nil
				}
				token := max(now.UnixMicro(), num(k.mr.HGet(key, schema.TokenField))+1)
				hold := ms + head.Handoff
				fields := []any{
					schema.OwnerField, head.Ticket, schema.EndField, hold, schema.TokenField, token,
					schema.MetaField, head.Metadata, schema.PoppedField, head.Seq,
					schema.QueueField, num(k.mr.HGet(key, schema.QueueField)) - 1,
				}
				if expires := num(k.mr.HGet(key, schema.ExpiresField)); expires < hold+stateMemory.Milliseconds() {
					expires = hold + 2*stateMemory.Milliseconds()
					fields = append(fields, schema.ExpiresField, expires)
					p.PExpireAt(ctx, key, time.UnixMilli(expires))
					p.PExpireAt(ctx, queue, time.UnixMilli(expires))
				}
				p.LPop(ctx, queue)
				p.HSet(ctx, key, fields...)
				p.Publish(ctx, key+":ch:"+schema.Client(head.Ticket), fmt.Sprintf("%s:%d:%d", head.Ticket, token, ms))
				return nil
			})
			if err == nil {
				owner, handed = o, ok
			}
			return err
		}, key, queue)
		if !errors.Is(err, redis.TxFailedErr) {
			return owner, handed, err
		}
	}
}

// handOff returns the record at the head of the fair queue of the lock
// whose hash is key, when the lock can be handed to it as lock_lib.lua's
// hand_off would at the server time ms: a plain lock's (not an
// election's, whose changes are announced), of the layout the kit knows,
// whose head waiter is alive on its own and was not withdrawn. Anything
// else is left to the waiters' next look.
func (k *Kit) handOff(key, queue string, ms int64) (schema.QueueRecord, bool) {
	if !strings.Contains(key, ":lock:{") || k.mr.HGet(key, schema.LayoutField) != "3" || k.mr.Type(queue) != "list" {
		return schema.QueueRecord{}, false
	}
	if num(k.mr.HGet(key, schema.QueueField)) <= 0 {
		return schema.QueueRecord{}, false
	}
	list, err := k.mr.List(queue)
	if err != nil || len(list) == 0 {
		return schema.QueueRecord{}, false
	}
	r, ok := schema.ParseQueueRecord(list[0])
	if !ok || r.Deadline < ms || r.Seq <= num(k.mr.HGet(key, schema.PoppedField)) || r.Seq > num(k.mr.HGet(key, schema.SeqField)) ||
		strings.ContainsAny(r.Ticket, ":{") {
		return schema.QueueRecord{}, false
	}
	if num(k.mr.HGet(key, schema.RefuseField)) > ms && k.mr.Exists(key+":released:"+r.Ticket) {
		return schema.QueueRecord{}, false // withdrawn
	}
	return r, true
}

// num returns a field's integer value, 0 for none.
func num(v string) int64 {
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// errKilled is what a killed Client's dials fail with.
var errKilled = errors.New("redisynctest: the Client was killed")

// dialer dials the connections of one Client's go-redis client, and cuts
// them all when the Client is killed.
type dialer struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	dead  bool
}

// dial is the go-redis client's Dialer.
func (d *dialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	dead := d.dead
	d.mu.Unlock()
	if dead {
		return nil, errKilled
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		_ = c.Close()
		return nil, errKilled
	}
	tc := &trackedConn{Conn: c, d: d}
	d.conns[tc] = struct{}{}
	return tc, nil
}

// cut closes every connection and refuses new ones.
func (d *dialer) cut() {
	d.mu.Lock()
	d.dead = true
	conns := make([]net.Conn, 0, len(d.conns))
	for c := range d.conns {
		conns = append(conns, c)
	}
	clear(d.conns)
	d.mu.Unlock()
	for _, c := range conns {
		_ = c.(*trackedConn).Conn.Close()
	}
}

// trackedConn is a connection that its dialer forgets once closed.
type trackedConn struct {
	net.Conn
	d *dialer
}

func (c *trackedConn) Close() error {
	c.d.mu.Lock()
	delete(c.d.conns, c)
	c.d.mu.Unlock()
	return c.Conn.Close()
}
