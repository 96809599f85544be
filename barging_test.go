package redisync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Plain (barging) waiters are recorded per Client in the lock's Bargers
// zset, and a release that hands the lock to nobody wakes the Client whose
// record runs out first, on its own grant channel: one process, not every
// process (issue 16). The waiters here recheck only once a minute, so a
// wake-up that did not reach them would fail the tests' 5 s waits.

// attempts is a go-redis hook that counts the runs of acquire.lua that
// Redis answered, by the Client whose ticket ran them.
type attempts struct {
	passHooks
	mu sync.Mutex
	n  map[string]int // by client id
}

// newBargingMini starts an embedded Redis and returns it with a go-redis
// client to it that counts acquire attempts.
func newBargingMini(t *testing.T) (*miniredis.Miniredis, *redis.Client, *attempts) {
	t.Helper()
	mr, rdb, _ := newMini(t)
	at := &attempts{n: map[string]int{}}
	addHook(rdb, at)
	return mr, rdb, at
}

func (a *attempts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if err != nil || len(args) < 5 || (args[1] != acquireScript.Hash() && args[1] != acquireScript.src) {
			return err
		}
		keys, _ := strconv.Atoi(fmt.Sprint(args[2]))
		ticket := fmt.Sprint(args[3+keys]) // "label/client-n"
		client := ticket[strings.LastIndex(ticket, "/")+1 : strings.LastIndex(ticket, "-")]
		a.mu.Lock()
		a.n[client]++
		a.mu.Unlock()
		return err
	}
}

// of returns how many attempts c made.
func (a *attempts) of(c *Client) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[c.id]
}

// bargingWaiter starts a barging Lock of the lock "g" on c and waits until
// it sleeps: c is recorded, its grant channel subscribed, and its last
// attempt before the sleep answered (the one after the subscription is
// confirmed, when it was not already), so that a release from then on
// wakes it and nothing changes c's record meanwhile. It returns the Mutex
// and Lock's result.
func bargingWaiter(t *testing.T, ctx context.Context, mr *miniredis.Miniredis, rdb *redis.Client, at *attempts, c *Client) (*Mutex, <-chan error) {
	t.Helper()
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	want := at.of(c) + 2
	if subscribed(c, k.GrantChannel(c.id)) {
		want-- // no subscription to wait for: one attempt, then the sleep
	}
	m := must(c.NewMutex("g", Barging(), WithRecheck(time.Minute)))
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }()
	eventually(t, 5*time.Second, "the waiter's Client to be recorded and subscribed, and the waiter to sleep", func() bool {
		_, err := mr.ZScore(k.Bargers, c.id)
		return err == nil && rdb.PubSubNumSub(ctx, k.GrantChannel(c.id)).Val()[k.GrantChannel(c.id)] == 1 && at.of(c) >= want
	})
	return m, done
}

// subscribed reports whether c's subscription of channel is confirmed.
func subscribed(c *Client, channel string) bool {
	_, _, confirmed, _ := c.sub.reg.Waiters(channel)
	return confirmed
}

// lockG returns a barging Mutex of a new Client on rdb that holds the lock
// "g".
func lockG(t *testing.T, rdb *redis.Client) *Mutex {
	t.Helper()
	m := must(newClient(t, rdb).NewMutex("g", Barging()))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}

// plainWaiters returns how many plain waiters c's subscriber has on the
// grant channel of the lock "g".
func plainWaiters(c *Client) int {
	_, plain, _, _ := c.sub.reg.Waiters(schema.LockKeys(schema.DefaultPrefix, "g").GrantChannel(c.id))
	return plain
}

// pendingResult fails the test if done has a result already.
func pendingResult(t *testing.T, done <-chan error, who string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned (%v) before the release meant for it", who, err)
	default:
	}
}

// Three Clients' waiters, recorded in turn: each release wakes the next
// one's Client alone, on its grant channel, and nothing reaches the others
// or the lock's own channel. The last release, with nobody recorded,
// publishes nothing.
func TestBargingReleaseWakesOneClient(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	clients := []*Client{newClient(t, rdb), newClient(t, rdb), newClient(t, rdb)}
	var ms []*Mutex
	var dones []<-chan error
	for _, c := range clients {
		m, done := bargingWaiter(t, ctx, mr, rdb, at, c)
		ms, dones = append(ms, m), append(dones, done)
	}
	msgs := listen(t, rdb, k.Channel+"*")

	prev := holder
	for i, c := range clients {
		if err := prev.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		m := next(t, msgs)
		if m.channel != k.GrantChannel(c.id) || m.payload != "" {
			t.Fatalf("release %d heard as %q on %s, want an empty message on %s", i, m.payload, m.channel, k.GrantChannel(c.id))
		}
		if err := result(t, dones[i]); err != nil {
			t.Fatal(err)
		}
		quiet(t, msgs, 50*time.Millisecond)
		for j := i + 1; j < len(clients); j++ {
			pendingResult(t, dones[j], "a later Client's waiter")
		}
		prev = ms[i]
	}
	if err := prev.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	quiet(t, msgs, 50*time.Millisecond)
	if mr.Exists(k.Bargers) {
		t.Fatalf("records left after every waiter took the lock: %v", zmembers(mr, k.Bargers))
	}
}

// A wake-up that reaches a Client whose waiter has given up is passed on:
// that Client's subscriber finds no plain waiter and runs wake.lua, which
// wakes the next recorded Client while the lock is free.
func TestBargingWakeupPassesOnWhenItsWaiterLeft(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	a, b := newClient(t, rdb), newClient(t, rdb)
	actx, cancel := context.WithCancel(ctx)
	_, da := bargingWaiter(t, actx, mr, rdb, at, a)
	wb, db := bargingWaiter(t, ctx, mr, rdb, at, b)
	cancel()
	if err := result(t, da); !errors.Is(err, context.Canceled) {
		t.Fatalf("a's cancelled Lock: %v", err)
	}
	if _, err := mr.ZScore(k.Bargers, a.id); err != nil {
		t.Fatal("a's record is gone: the test would not send a wake-up to a Client without waiters")
	}
	msgs := listen(t, rdb, k.Channel+"*")

	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if m := next(t, msgs); m.channel != k.GrantChannel(a.id) {
		t.Fatalf("the release woke %s, want a's %s (its record runs out first)", m.channel, k.GrantChannel(a.id))
	}
	if m := next(t, msgs); m.channel != k.GrantChannel(b.id) {
		t.Fatalf("the wake-up was passed on to %s, want b's %s", m.channel, k.GrantChannel(b.id))
	}
	if err := result(t, db); err != nil {
		t.Fatalf("b's Lock: %v", err)
	}
	if err := wb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter that takes the lock while other plain waiters of its Client
// wait records its Client again, so that the next release wakes them.
func TestBargingTakerRecordsItsClientForTheOthers(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	a := newClient(t, rdb)
	w1, d1 := bargingWaiter(t, ctx, mr, rdb, at, a)
	w2, d2 := bargingWaiter(t, ctx, mr, rdb, at, a)
	eventually(t, 5*time.Second, "both waiters to wait", func() bool { return plainWaiters(a) == 2 })

	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	first, second, dsecond := w1, w2, d2
	select {
	case err := <-d1:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-d2:
		if err != nil {
			t.Fatal(err)
		}
		first, second, dsecond = w2, w1, d1
	case <-time.After(5 * time.Second):
		t.Fatal("neither waiter took the lock within 5 s of its release")
	}
	if _, err := mr.ZScore(k.Bargers, a.id); err != nil {
		t.Fatal("the waiter that took the lock did not record its Client again for the other")
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, dsecond); err != nil {
		t.Fatal(err)
	}
	if err := second.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A TryLock does not wait, and records nothing; the record of a waiting
// Lock has a TTL that covers its sleep between attempts.
func TestBargingRecordsOnlyWaitersWithATTL(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	c := newClient(t, rdb)
	if ok, err := must(c.NewMutex("g", Barging())).TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock of a held lock: %v, %v", ok, err)
	}
	if mr.Exists(k.Bargers) {
		t.Fatal("a TryLock recorded its Client as waiting")
	}
	w, done := bargingWaiter(t, ctx, mr, rdb, at, c)
	if ttl := mr.TTL(k.Bargers); ttl < time.Minute || ttl > 2*time.Minute {
		t.Fatalf("the record's key lives %v, want the waiter's recheck (1 min) to 2 min", ttl)
	}
	if st, err := c.InspectLock(ctx, "g"); err != nil || st.Barging != 1 {
		t.Fatalf("InspectLock: %+v, %v; want 1 Client recorded as barging", st, err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Bargers key of the wrong type fails a barging Lock that finds the lock
// taken, before it writes anything; a release still releases (and wakes
// nobody), and leaves the key as it was.
func TestBargingWrongTypeRecord(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	if err := mr.Set(k.Bargers, "x"); err != nil {
		t.Fatal(err)
	}
	before := mr.Keys()
	m := must(newClient(t, rdb).NewMutex("g", Barging()))
	if err := m.Lock(ctx); !errors.Is(err, ErrWrongType) {
		t.Fatalf("barging Lock with a Bargers key of the wrong type: %v, want ErrWrongType", err)
	}
	// The failed call's withdrawal leaves its ticket's tombstone, as
	// after any failure that may have run (see place.mustWithdraw).
	var after []string
	for _, key := range mr.Keys() {
		if !strings.Contains(key, ":released:") {
			after = append(after, key)
		}
	}
	if !slices.Equal(after, before) {
		t.Fatalf("the failed Lock changed the keys: %v, then %v", before, after)
	}
	if v := holdIDs(t, mr, k.Hash); len(v) != 1 || v[0] != holder.holdID() {
		t.Fatalf("the holder became %q", v)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatalf("release with a Bargers key of the wrong type: %v", err)
	}
	if lockHeld(t, mr, k.Hash) {
		t.Fatal("the release left the lock held")
	}
	if v, err := mr.Get(k.Bargers); err != nil || v != "x" {
		t.Fatalf("the Bargers key became %q, %v", v, err)
	}
}

// zmembers returns the members of a zset, for messages.
func zmembers(mr *miniredis.Miniredis, key string) []string {
	m, _ := mr.ZMembers(key)
	return m
}

// Barging waiters recorded per Client: whose record a wake-up finds, and
// which records are dropped.

// Two barging Mutexes of one Client on one lock with different
// recheck intervals share one record; the short-recheck one overwrites the
// long one's score downwards (ZADD without GT). Once the short one gives
// up, the record runs out while the long one still sleeps: the release
// drops it and wakes nobody.
func TestBargingMixedRecheckRecordRunsOut(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	a := newClient(t, rdb)
	long, dlong := bargingWaiter(t, ctx, mr, rdb, at, a) // WithRecheck(time.Minute)
	short := must(a.NewMutex("g", Barging(), WithRecheck(50*time.Millisecond)))
	sctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel()
	if err := short.Lock(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("short Lock: %v", err)
	}
	// Time passes (not a wait for a condition): past the short one's
	// last record (100 ms), well within the long one's (2 min).
	time.Sleep(300 * time.Millisecond)
	if score, err := mr.ZScore(k.Bargers, a.id); err != nil || int64(score) < time.Now().Add(time.Minute).UnixMilli() {
		t.Fatalf("a's record stands until %d (%v), want the long waiter's 2 min", int64(score), err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, dlong); err != nil { // fails: no wake-up for a minute
		t.Fatal(err)
	}
	_ = long.Unlock(ctx)
}

// A Client's plain waiter gives up (its record stands), its grant
// channel is swept; a fair Mutex of the same Client on the same lock then
// subscribes the channel anew, with no plain waiter. The release that
// wakes that Client (its stale record runs out first) reaches it (PUBLISH
// returns 1): it must be passed on, or b's recorded waiter is not woken
// (on f4c6f35 the channel's pass was set by plain waiters only).
func TestBargingFairChannelWithoutPassSwallowsWakeup(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	a, b := newClient(t, rdb), newClient(t, rdb)
	actx, cancel := context.WithCancel(ctx)
	_, da := bargingWaiter(t, actx, mr, rdb, at, a)
	cancel()
	if err := result(t, da); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	name := k.GrantChannel(a.id)
	eventually(t, 10*time.Second, "a's channel to be swept", func() bool {
		_, _, _, known := a.sub.reg.Waiters(name)
		return !known
	})
	wb, db := bargingWaiter(t, ctx, mr, rdb, at, b)

	fair := must(a.NewMutex("g"))
	df := make(chan error, 1)
	go func() { df <- fair.Lock(ctx) }()
	eventually(t, 5*time.Second, "a's fair waiter to subscribe", func() bool { return confirmedWaiters(a, name) == 1 })
	if err := holder.Unlock(ctx); err != nil { // handed to a's fair waiter
		t.Fatal(err)
	}
	if err := result(t, df); err != nil {
		t.Fatal(err)
	}
	msgs := listen(t, rdb, k.Channel+"*")
	if err := fair.Unlock(ctx); err != nil { // wakes a (stale record), not b
		t.Fatal(err)
	}
	if m := next(t, msgs); m.channel != name {
		t.Fatalf("the release woke %s, want a's stale record %s first", m.channel, name)
	}
	if err := result(t, db); err != nil {
		t.Fatal(err)
	}
	_ = wb.Unlock(ctx)
}

// A RedMutex that waits, and then takes node locks, must not
// record its own Client on the nodes it takes (on f4c6f35 plainOthers
// counted its own waiter, whose address was ""), else its Unlock wakes
// itself on each node (and each node runs wake.lua). The holder's node
// locks and the waiter's records are deleted at once, and the waiter
// woken on node 0, so that its round finds every node free.
func TestBargingRedMutexRecordsItself(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	// The lock is held on every node, by a Mutex of each node's own: a
	// RedMutex holds a quorum, and a node that answered after its round
	// ended is given back (which a loaded machine does), where the
	// waiter would then take the lock rather than be recorded.
	for _, rdb := range rdbs {
		if err := must(newClient(t, rdb).NewMutex("g", Barging(), WithRecheck(time.Minute))).Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A node timeout that no first attempt on a loaded machine runs past
	// (dialling the Client's own connection first): one that did would be
	// abandoned, its node left to the next recheck.
	r := newRedlock(t, rdbs, WithNodeTimeout(5*time.Second))
	cs := r.clients
	w := must(r.NewMutex("g", WithRecheck(time.Minute)))
	done := make(chan error, 1)
	go func() { done <- w.Lock(ctx) }()
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	for i, mr := range mrs {
		eventually(t, 5*time.Second, "the waiter to be recorded and to subscribe", func() bool {
			_, err := mr.ZScore(k.Bargers, cs[i].id)
			return err == nil && confirmedWaiters(cs[i], k.GrantChannel(cs[i].id)) == 1
		})
	}
	for _, mr := range mrs {
		mr.Del(k.Hash)
		mr.Del(k.Bargers)
	}
	if err := rdbs[0].Publish(ctx, k.GrantChannel(cs[0].id), "").Err(); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	var msgs []<-chan message
	for i, mr := range mrs {
		if _, err := mr.ZScore(k.Bargers, cs[i].id); err == nil {
			t.Errorf("node %d: the RedMutex that took the lock recorded its own Client as waiting", i)
		}
		msgs = append(msgs, listen(t, rdbs[i].(*redis.Client), k.Channel+"*"))
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		quiet(t, m, 100*time.Millisecond)
	}
}

// Records of Clients that gave up must be dropped even while no
// release hands the lock to nobody (each new record extends the key's
// TTL): on f4c6f35 the key grew with every Client that ever waited.
func TestBargingBargersGrowWhileHeld(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	lockG(t, rdb)
	// One long-lived waiter keeps the key alive (its record: 2 min).
	_, _ = bargingWaiter(t, ctx, mr, rdb, at, newClient(t, rdb))
	for i := 0; i < 20; i++ {
		c := newClient(t, rdb)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		_ = must(c.NewMutex("g", Barging(), WithRecheck(10*time.Millisecond))).Lock(cctx)
		cancel()
		_ = c.Close()
	}
	// Time passes (not a wait for a condition): past the last short
	// record (20 ms). One more waiter records its Client: records run
	// out by now are dropped on the way.
	time.Sleep(50 * time.Millisecond)
	_, _ = bargingWaiter(t, ctx, mr, rdb, at, newClient(t, rdb))
	members, _ := mr.ZMembers(k.Bargers)
	live := 0
	for _, m := range members {
		if s, _ := mr.ZScore(k.Bargers, m); int64(s) >= time.Now().UnixMilli() {
			live++
		}
	}
	if len(members) != 2 || live != 2 {
		t.Errorf("bargers: %d members, %d live; want the 2 live waiters' Clients alone", len(members), live)
	}
}

// wakeCounter counts runs of wake.lua.
type wakeCounter struct {
	passHooks
	n atomic.Int64
}

func (w *wakeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		a := cmd.Args()
		if err == nil && len(a) > 1 && (a[1] == wakeScript.Hash() || a[1] == wakeScript.src) {
			w.n.Add(1) // runs answered (not an EVALSHA's NOSCRIPT)
		}
		return err
	}
}

// The barging wake-up (wake.lua): which Clients run it, and whom it
// wakes.

// Client level: a fair-only Client (default Mutex, no Barging anywhere)
// whose waiter is woken by a reconnect (wakeAll, as registry.missed does)
// as its ctx ends runs no wake.lua.
func TestBargingFairOnlyClientRunsWake(t *testing.T) {
	_, rdb, _ := newMini(t)
	wc := &wakeCounter{}
	addHook(rdb, wc)
	holder := must(newClient(t, rdb).NewMutex("g"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	a := newClient(t, rdb)
	name := schema.LockKeys(schema.DefaultPrefix, "g").GrantChannel(a.id)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- must(a.NewMutex("g")).Lock(wctx) }()
	eventually(t, 5*time.Second, "the fair waiter to subscribe", func() bool { return confirmedWaiters(a, name) == 1 })
	a.sub.reg.Confirm(name) // a confirmation of a confirmed channel: a reconnect's, which wakes every waiter
	cancel()
	if err := result(t, done); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	_ = a.Close() // waits for background calls
	if n := wc.n.Load(); n != 0 {
		t.Errorf("a fair-only Client ran wake.lua %d times", n)
	}
}
