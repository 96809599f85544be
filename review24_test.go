package redisync

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Review 24 (independent, adversarial, of f4c6f35: barging waiters
// recorded per Client). Each test failed on f4c6f35.

// Finding 1: two barging Mutexes of one Client on one lock with different
// recheck intervals share one record; the short-recheck one overwrites the
// long one's score downwards (ZADD without GT). Once the short one gives
// up, the record runs out while the long one still sleeps: the release
// drops it and wakes nobody.
func TestReview24MixedRecheckRecordRunsOut(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	holder := lockG(t, rdb)
	a := newClient(t, rdb)
	long, dlong := bargingWaiter(t, ctx, mr, rdb, at, a) // WithRecheck(time.Minute)
	short := a.NewMutex("g", Barging(), WithRecheck(50*time.Millisecond))
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

// Finding 2: a Client's plain waiter gives up (its record stands), its grant
// channel is swept; a fair Mutex of the same Client on the same lock then
// subscribes the channel anew, with no plain waiter. The release that
// wakes that Client (its stale record runs out first) reaches it (PUBLISH
// returns 1): it must be passed on, or b's recorded waiter is not woken
// (on f4c6f35 the channel's pass was set by plain waiters only).
func TestReview24FairChannelWithoutPassSwallowsWakeup(t *testing.T) {
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
		a.sub.reg.mu.Lock()
		defer a.sub.reg.mu.Unlock()
		return a.sub.reg.channels[name] == nil
	})
	wb, db := bargingWaiter(t, ctx, mr, rdb, at, b)

	fair := a.NewMutex("g")
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

// Finding 4: a RedMutex that waits, and then takes node locks, must not
// record its own Client on the nodes it takes (on f4c6f35 plainOthers
// counted its own waiter, whose address was ""), else its Unlock wakes
// itself on each node (and each node runs wake.lua). The holder's node
// locks and the waiter's records are deleted at once, and the waiter
// woken on node 0, so that its round finds every node free.
func TestReview24RedMutexRecordsItself(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	h := newRedlock(t, rdbs).NewMutex("g", WithRecheck(time.Minute))
	if err := h.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	r := newRedlock(t, rdbs)
	cs := r.clients
	w := r.NewMutex("g", WithRecheck(time.Minute))
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

// Finding 5: records of Clients that gave up must be dropped even while no
// release hands the lock to nobody (each new record extends the key's
// TTL): on f4c6f35 the key grew with every Client that ever waited.
func TestReview24BargersGrowWhileHeld(t *testing.T) {
	mr, rdb, at := newBargingMini(t)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	lockG(t, rdb)
	// One long-lived waiter keeps the key alive (its record: 2 min).
	_, _ = bargingWaiter(t, ctx, mr, rdb, at, newClient(t, rdb))
	for i := 0; i < 20; i++ {
		c := newClient(t, rdb)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		_ = c.NewMutex("g", Barging(), WithRecheck(10*time.Millisecond)).Lock(cctx)
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
