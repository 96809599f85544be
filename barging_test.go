package redisync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	mu sync.Mutex
	n  map[string]int // by client id
}

// newBargingMini starts an embedded Redis and returns it with a go-redis
// client to it that counts acquire attempts.
func newBargingMini(t *testing.T) (*miniredis.Miniredis, *redis.Client, *attempts) {
	t.Helper()
	mr, rdb, _ := newMini(t)
	at := &attempts{n: map[string]int{}}
	rdb.AddHook(at)
	return mr, rdb, at
}

func (a *attempts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (a *attempts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if err != nil || len(args) < 9 || (args[1] != acquireScript.Hash() && args[1] != luaLib+luaAcquire) {
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

func (a *attempts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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
	m := c.NewMutex("g", Barging(), WithRecheck(time.Minute))
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
	r := c.sub.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[channel]
	return ch != nil && ch.confirmed
}

// lockG returns a barging Mutex of a new Client on rdb that holds the lock
// "g".
func lockG(t *testing.T, rdb *redis.Client) *Mutex {
	t.Helper()
	m := newClient(t, rdb).NewMutex("g", Barging())
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}

// plainWaiters returns how many plain waiters c's subscriber has on the
// grant channel of the lock "g".
func plainWaiters(c *Client) int {
	name := schema.LockKeys(schema.DefaultPrefix, "g").GrantChannel(c.id)
	r := c.sub.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	if ch := r.channels[name]; ch != nil {
		for _, w := range ch.waiters {
			if w.plain {
				n++
			}
		}
	}
	return n
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
	if ok, err := c.NewMutex("g", Barging()).TryLock(ctx); ok || err != nil {
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
	m := newClient(t, rdb).NewMutex("g", Barging())
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
	if v := mr.HGet(k.Hash, holder.holdID()); v != "1" {
		t.Fatalf("the holder's count became %q", v)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatalf("release with a Bargers key of the wrong type: %v", err)
	}
	if mr.Exists(k.Hash) {
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
