package redisync

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

// layout1Script loads a script of layout 1 (redisync at c15c6cd, before
// layouts were numbered), as an older version in a rolling deploy runs it.
func layout1Script(t *testing.T, name string) *redis.Script {
	t.Helper()
	lib, err := os.ReadFile("testdata/layout1/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile("testdata/layout1/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return redis.NewScript(string(lib) + string(body))
}

// Review 8, finding 1. A fair queue shared by an old and a new version: the
// old version's release hands the lock to a new-version waiter with a
// hash that has no layout mark. That hold is a new version's, renewed by
// its watchdog for as long as it likes; yet every other new-version call
// gets ErrLayout ("layout 1") for the whole hold, long after the old
// version is gone. docs/upgrading.md says ErrLayout lasts "at most their
// lease after the last old instance stops".
func TestReview8HoldHandedOverByLayout1StaysUnmarked(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")
	lease := 300 * time.Millisecond

	cn := newClient(t, rdb, WithLabel("new-holder"))
	n := cn.NewMutex("job")
	if err := n.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// An old-version fair waiter, queued first (layout 1: arrival numbers).
	old := "old-version/abc-1"
	mr.ZAdd(k.Queue, 1, old)
	mr.HSet(k.Waiters, old, strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)+":5000")
	mr.SetTTL(k.Queue, time.Minute)
	mr.SetTTL(k.Waiters, time.Minute)

	// A new-version fair waiter behind it. It does not hear a hand-off by
	// the old version (published on the lock's channel, not on its
	// Client's grant channel): it takes the hold handed to it at its next
	// recheck, within the hand-off lease (see docs/upgrading.md).
	cb := newClient(t, rdb, WithLabel("new-waiter"), WithWatchdogLease(lease), WithRecheck(100*time.Millisecond))
	b := cb.NewMutex("job")
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Lock(lctx) }()
	eventually(t, 5*time.Second, "b to queue behind the old waiter", func() bool {
		m, _ := mr.ZMembers(k.Queue)
		return len(m) == 2
	})

	// The new holder releases: the old waiter gets the lock (marked).
	if err := n.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := holdIDs(t, mr, k.Hash); len(ids) != 1 || ids[0] != old {
		t.Fatalf("holder %q, want the old waiter", ids)
	}
	// The old version releases with its own script: it hands the lock to b.
	tok, _ := strconv.ParseInt(mustGet(t, mr, k.Token), 10, 64)
	if res, err := layout1Script(t, "release.lua").Run(ctx, rdb,
		[]string{k.Hash, k.Token, k.Queue, k.Waiters, k.Tombstone(old), k.Hash + ":withdrawn"}, // layout 1's keys
		old, tok, 10000, k.Channel, "PUBLISH", "release").Int64(); err != nil || res != 1 {
		t.Fatalf("the old version's release: %v, %v", res, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("b: %v", err)
	}
	// The old version is gone. b's watchdog renews its hold, again and
	// again, well past a lease.
	for range 3 {
		mr.FastForward(lease / 2)
		eventually(t, 5*time.Second, "a renewal of b's hold", func() bool { return mr.TTL(k.Hash) == lease })
	}

	c := newClient(t, rdb, WithLabel("new-other"))
	for _, m := range []*Mutex{c.NewMutex("job", Barging()), c.NewMutex("job")} {
		if ok, err := m.TryLock(ctx); ok || err != nil {
			t.Errorf("TryLock while a new-version hold is renewed: %v, %v; want false, nil (held), not ErrLayout", ok, err)
		}
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func mustGet(t *testing.T, mr interface{ Get(string) (string, error) }, key string) string {
	t.Helper()
	v, err := mr.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Review 8, finding 2. A label may hold '#' (any printable ASCII but space
// and braces); a semaphore waiter id is "holder id#call". InspectSemaphore
// cuts the id at the first '#', the scripts (sem_holder) at the last: the
// waiter's Holder and Label come out wrong.
func TestReview8InspectSemaphoreWaiterWithHashInLabel(t *testing.T) {
	_, rdb, _ := newMini(t)
	a := newClient(t, rdb, WithLabel("a"))
	w := newClient(t, rdb, WithLabel("pool#2"))
	sa := a.NewSemaphore("gpus", 1)
	if err := sa.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	sw := w.NewSemaphore("gpus", 1)
	go func() { done <- sw.Acquire(wctx, 1) }()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool {
		st, err := a.InspectSemaphore(ctx, "gpus")
		return err == nil && len(st.Queue) == 1
	})
	st, err := a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	q := st.Queue[0]
	if want := q.ID[:strings.LastIndexByte(q.ID, '#')]; q.Holder != want || q.Label != "pool#2" {
		t.Errorf("waiter %q: holder %q, label %q; want holder %q, label %q", q.ID, q.Holder, q.Label, want, "pool#2")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := sa.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// Review 8, finding 3: a refused call holds nothing and leaves only the
// record of its withdrawn ticket (with a TTL): an error reply may answer
// go-redis's retry of a copy that ran, so the call is withdrawn, as any
// call that failed after it was sent (docs/upgrading.md says so).
func TestReview8LayoutRefusalHoldsNothing(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	k := schema.LockKeys("redisync", "job")
	warm := c.NewMutex("warm-up") // loads the scripts: one EVALSHA each from here on
	if err := warm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.HSet(k.Hash, "other-version/abc-1", "1")
	mr.SetTTL(k.Hash, time.Minute)
	before := mr.Dump()
	n0 := cnt.n.Load()
	m := c.NewMutex("job")
	if ok, err := m.TryLock(ctx); ok || !errors.Is(err, ErrLayout) {
		t.Fatalf("TryLock: %v, %v; want ErrLayout", ok, err)
	}
	_ = c.Close() // waits for any clean-up still under way
	if m.Token() != 0 || m.Lost() != nil {
		t.Error("a refused TryLock holds")
	}
	ws := withdrawnTickets(t, mr, k)
	if len(ws) != 1 {
		t.Errorf("withdrawn tickets %q, want the refused TryLock's", ws)
	}
	for _, w := range ws {
		mr.Del(w)
	}
	if after := mr.Dump(); after != before {
		t.Errorf("a refused TryLock wrote more than its withdrawal:\n%s\nwant\n%s", after, before)
	}
	if n := cnt.n.Load() - n0; n != 2 {
		t.Errorf("%d commands for a refused TryLock, want 2 (the attempt, the withdrawal)", n)
	}
}

// Review 8, finding 4. LockState.LastToken: "the holder's while the lock
// is held"; design.md: the counter is kept "as long as the lease". A fair
// waiter that finds the lock free (its holder's lease ran out) hands it to
// itself in acquire.lua: the token is minted for the short hand-off lease
// (so the counter lives an hour) and then the lock's lease is set to the
// full lease. With a watchdog lease over an hour whose renewals stop
// (WithMaxHold), the hold outlives its counter: InspectLock then reports
// token 0 for a held lock.
func TestReview8SelfHandoffHoldOutlivesItsTokenCounter(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")
	a := newClient(t, rdb, WithLabel("a"), WithLease(time.Minute))
	b := newClient(t, rdb, WithLabel("b"), WithWatchdogLease(2*time.Hour),
		WithMaxHold(10*time.Minute), WithHeartbeat(2*time.Minute), WithRecheck(20*time.Millisecond))
	ma, mb := a.NewMutex("job"), b.NewMutex("job")
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- mb.Lock(lctx) }()
	eventually(t, 5*time.Second, "b to queue", func() bool {
		m, _ := mr.ZMembers(k.Queue)
		return len(m) == 1
	})
	mr.FastForward(61 * time.Second) // a's lease runs out: nobody releases
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mr.FastForward(61 * time.Minute) // no renewal: past b's max hold
	st, err := b.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if st.Holder == nil || st.Holder.Label != "b" {
		t.Fatalf("holder %+v; want b, whose lease is 2h", st.Holder)
	}
	if st.Holder.Token != mb.Token() {
		t.Errorf("InspectLock: holder's token %d, want b's %d (counter TTL %v, lock TTL %v)",
			st.Holder.Token, mb.Token(), mr.TTL(k.Token), mr.TTL(k.Hash))
	}
	_ = mb.Unlock(ctx)
}

// Coverage: the fencing-token counter lives as long as the hold's lease
// (mint, renew.lua, extend.lua, redlock_raise.lua). No test failed when
// any one of those four was reverted.
func TestReview8TokenCounterFollowsTheLease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")

	t.Run("mint", func(t *testing.T) {
		m := newClient(t, rdb).NewMutex("job", WithLease(2*time.Hour))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		if ttl := mr.TTL(k.Token); ttl < 2*time.Hour {
			t.Errorf("counter TTL %v after a 2h hold was minted", ttl)
		}
	})
	t.Run("extend", func(t *testing.T) {
		m := newClient(t, rdb).NewMutex("job", WithLease(time.Second))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		if err := m.Extend(ctx, 3*time.Hour); err != nil {
			t.Fatal(err)
		}
		if ttl := mr.TTL(k.Token); ttl < 3*time.Hour {
			t.Errorf("counter TTL %v after Extend(3h)", ttl)
		}
	})
	t.Run("renew", func(t *testing.T) {
		lease := 300 * time.Millisecond
		m := newClient(t, rdb, WithWatchdogLease(lease)).NewMutex("job")
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		mr.SetTTL(k.Token, time.Millisecond) // as an hour into a long hold
		eventually(t, 5*time.Second, "a renewal to keep the counter", func() bool { return mr.TTL(k.Token) >= lease })
	})
	t.Run("redlock raise", func(t *testing.T) {
		c := newClient(t, rdb)
		m := c.NewMutex("job", WithLease(2*time.Hour))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		if err := redlockRaiseScript.Run(ctx, rdb, []string{k.Hash, k.Token}, m.holdID(), m.Token()+1000).Err(); err != nil {
			t.Fatal(err)
		}
		if ttl := mr.TTL(k.Token); ttl < 2*time.Hour-time.Second {
			t.Errorf("counter TTL %v after a raise during a 2h hold", ttl)
		}
	})
}

// Coverage: queue scores stay in arrival order when the server clock steps
// back (join_queue: the last member's score plus one). No test failed when
// the score was the clock alone.
func TestReview8QueueOrderSurvivesAClockStepBack(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")
	now := time.Now()
	mr.SetTime(now)
	h := newClient(t, rdb)
	mh := h.NewMutex("job")
	if err := mh.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var ms []*Mutex
	errs := make(chan error, 2)
	for i := range 2 {
		m := newClient(t, rdb, WithLabel("w"+strconv.Itoa(i))).NewMutex("job")
		ms = append(ms, m)
		go func() { errs <- m.Lock(lctx) }()
		eventually(t, 5*time.Second, "a waiter to queue", func() bool {
			m, _ := mr.ZMembers(k.Queue)
			return len(m) == i+1
		})
		mr.SetTime(now.Add(-time.Hour)) // the clock steps back
	}
	st, err := h.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Queue) != 2 || st.Queue[0].Label != "w0" || st.Queue[1].Label != "w1" {
		t.Fatalf("queue %+v; want w0 then w1", st.Queue)
	}
	if err := mh.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if ms[0].Token() == 0 {
		t.Errorf("w1 got the lock before w0")
	}
	cancel()
	<-errs
	_ = ms[0].Unlock(ctx)
}
