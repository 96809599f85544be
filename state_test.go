package redisync

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Issue 19, point 5: nothing redisync writes stays in Redis for good. After
// every primitive was used (contended, queued, released), every key left
// has a TTL: the fencing token counter and a semaphore's size included.
func TestNothingLeftWithoutTTL(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	for _, opts := range [][]Option{{Barging()}, nil} {
		a, b := c.NewMutex("m", opts...), c.NewMutex("m", opts...)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- b.Lock(ctx) }()
		eventually(t, 5*time.Second, "b to wait", func() bool { return confirmedWaiters(c, b.post().channel) == 1 })
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := result(t, done); err != nil {
			t.Fatal(err)
		}
		if err := b.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, w := c.NewSemaphore("s", 1), c.NewSemaphore("s", 1)
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, w, 1)
	eventually(t, 5*time.Second, "w to queue", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if err := w.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// A read-write lock's write handed to a queued writer: its token.
	rw, rw2 := c.NewRWMutex("rw"), c.NewRWMutex("rw")
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	locked := async(func() error { return rw2.Lock(ctx) })
	eventually(t, 5*time.Second, "rw2 to queue", func() bool { return rwQueueLen(t, mr) == 1 })
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, locked); err != nil {
		t.Fatal(err)
	}
	if err := rw2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range mr.Keys() {
		if mr.TTL(k) <= 0 {
			t.Errorf("key %q has no TTL", k)
		}
	}
}

// Fencing tokens strictly increase per name across the expiry of the
// counter that remembers the last one (they follow the server clock), and
// while it is stored, across a server clock that steps back.
func TestTokensIncreaseAcrossStateExpiry(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := c.NewMutex("t")
	key := "redisync:lock:{t}:token"
	hold := func() int64 {
		t.Helper()
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		token := m.Token()
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		return token
	}
	first := hold()
	// The server clock steps back ten minutes: the counter, still stored,
	// keeps the next token above the last.
	mr.SetTime(time.Now().Add(-10 * time.Minute))
	second := hold()
	if second <= first {
		t.Fatalf("after the clock stepped back: token %d, then %d", first, second)
	}
	// An hour and a bit of idleness later the counter is gone, and the
	// clock (moved on as far) gives a larger token still.
	mr.FastForward(time.Hour + time.Minute)
	if mr.Exists(key) {
		t.Fatal("the token counter outlived an hour of idleness")
	}
	mr.SetTime(time.Now().Add(time.Hour))
	if third := hold(); third <= second {
		t.Fatalf("after the counter expired: token %d, then %d", second, third)
	}
}

// Review 5, finding 2: a semaphore's size is to live "while it is in use
// and an hour after its last Acquire", but a partial Release re-arms the
// holder's lease (sem_rearm) without the size key's TTL, and with a fixed
// lease nothing renews it. A holder that acquires with WithFixedLease and gives
// back part of its permits late in the lease holds the rest past the size
// key's expiry; the size is then gone while the semaphore is in use, and a
// Semaphore opened with another size is accepted (ErrSizeMismatch is not
// reported) and grants beyond the size the holder was granted under.
func TestSemaphorePartialReleaseOutlivesSizeKey(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, rdb, WithFixedLease(59*time.Minute))
	t0 := time.Now()
	mr.SetTime(t0)
	s := c.NewSemaphore("s", 2)
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// 58 minutes on (server clock and TTLs), s gives back 1 of its 2: its
	// lease starts anew for 59 minutes.
	mr.SetTime(t0.Add(58 * time.Minute))
	mr.FastForward(58 * time.Minute)
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// 3 minutes later s still holds 1 permit in Redis (lease until 117 min).
	mr.SetTime(t0.Add(61 * time.Minute))
	mr.FastForward(3 * time.Minute)
	if got := permitsOf(mr, s); got != "1" || s.Held() != 1 {
		t.Fatalf("s holds %d, Redis %q; want 1 and 1", s.Held(), got)
	}
	if !mr.Exists(semKey + ":size") {
		t.Errorf("the size key expired while s holds a permit whose lease ends in 56 minutes")
	}
	other := c.NewSemaphore("s", 3)
	ok, err := other.TryAcquire(ctx, 2)
	if err == nil {
		t.Fatalf("a Semaphore of size 3 was accepted while a holder of the size-2 semaphore holds (TryAcquire(2): %v): %d + %d permits of 2 held", ok, s.Held(), other.Held())
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
func TestSelfHandoffHoldOutlivesItsTokenCounter(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")
	a := newClient(t, rdb, WithLabel("a"), WithFixedLease(time.Minute))
	b := newClient(t, rdb, WithLabel("b"), WithCrashTimeout(2*time.Hour),
		WithMaxHold(10*time.Minute), WithWaiterTimeout(2*time.Minute), WithRecheck(20*time.Millisecond))
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
func TestTokenCounterFollowsTheLease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")

	t.Run("mint", func(t *testing.T) {
		m := newClient(t, rdb).NewMutex("job", WithFixedLease(2*time.Hour))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		if ttl := mr.TTL(k.Token); ttl < 2*time.Hour {
			t.Errorf("counter TTL %v after a 2h hold was minted", ttl)
		}
	})
	t.Run("extend", func(t *testing.T) {
		m := newClient(t, rdb).NewMutex("job", WithFixedLease(time.Second))
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
		m := newClient(t, rdb, WithCrashTimeout(lease)).NewMutex("job")
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		mr.SetTTL(k.Token, time.Millisecond) // as an hour into a long hold
		eventually(t, 5*time.Second, "a renewal to keep the counter", func() bool { return mr.TTL(k.Token) >= lease })
	})
	t.Run("redlock raise", func(t *testing.T) {
		c := newClient(t, rdb)
		m := c.NewMutex("job", WithFixedLease(2*time.Hour))
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
