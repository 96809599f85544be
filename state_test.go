package redisync

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Nothing redisync writes stays in Redis for good. After every primitive
// was used (contended, queued, released), every key left has a TTL: a
// lock's hash (which a release leaves, with its last token) and a
// semaphore's size included.
func TestNothingLeftWithoutTTL(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	for _, opts := range [][]Option{{Barging()}, nil} {
		a, b := must(c.NewMutex("m", opts...)), must(c.NewMutex("m", opts...))
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
	s, w := must(c.NewSemaphore("s", 1)), must(c.NewSemaphore("s", 1))
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
	rw, rw2 := must(c.NewRWMutex("rw")), must(c.NewRWMutex("rw"))
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
// lock's hash, whose {token} remembers the last one (they follow the
// server clock), and while it is stored, across a server clock that steps
// back.
func TestTokensIncreaseAcrossStateExpiry(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMutex("t"))
	key := "redisync:lock:{t}"
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
	back := time.Now().Add(-10 * time.Minute)
	mr.SetTime(back)
	second := hold()
	if second <= first {
		t.Fatalf("after the clock stepped back: token %d, then %d", first, second)
	}
	// The hash outlives the hold by an hour at least, then goes; the
	// clock, moved on as far, gives a larger token still.
	ttl := mr.TTL(key)
	if ttl < time.Hour {
		t.Fatalf("the lock's state has a TTL of %v after its release, want an hour at least", ttl)
	}
	mr.FastForward(ttl + time.Minute)
	if mr.Exists(key) {
		t.Fatal("the lock's state outlived its TTL")
	}
	mr.SetTime(back.Add(ttl + time.Minute))
	if third := hold(); third <= second {
		t.Fatalf("after the counter expired: token %d, then %d", second, third)
	}
}

// A semaphore's size lives "while it is in use and an hour after its last
// Acquire": a partial Release, which re-arms the holder's lease
// (sem_rearm), keeps the size as long, though with a fixed lease
// nothing renews it. Otherwise a holder that acquires with WithFixedLease
// and gives back part of its permits late in the lease would hold the rest
// past its size's expiry, and a Semaphore made with another size
// would store its own and grant beyond the size the holder was granted
// under.
func TestSemaphorePartialReleaseOutlivesItsSize(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, rdb, WithFixedLease(59*time.Minute))
	t0 := time.Now()
	mr.SetTime(t0)
	s := must(c.NewSemaphore("s", 2))
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
	if mr.HGet(semKey, "{size}") == "" {
		t.Errorf("the size expired while s holds a permit whose lease ends in 56 minutes")
	}
	other := must(c.NewSemaphore("s", 3))
	ok, err := other.TryAcquire(ctx, 2)
	if ok || err != nil || other.Size() != 2 {
		t.Fatalf("a Semaphore made with size 3 while a holder of the size-2 semaphore holds: TryAcquire(2): %v, %v, size %d; want false, nil, 2 (%d + %d permits of 2 held)", ok, err, other.Size(), s.Held(), other.Held())
	}
}

// A fair waiter that finds the lock free (its holder's lease ran out)
// hands it to itself in acquire.lua, for its full lease: the hold, and
// the hash that keeps its token, outlive an hour without renewals
// (WithMaxHold stops them), and InspectLock reports the holder's token.
func TestSelfHandoffHoldKeepsItsToken(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")
	t0 := time.Now().Truncate(time.Millisecond)
	mr.SetTime(t0)
	a := newClient(t, rdb, WithLabel("a"), WithFixedLease(time.Minute))
	b := newClient(t, rdb, WithLabel("b"), WithCrashTimeout(2*time.Hour),
		WithMaxHold(10*time.Minute), WithWaiterTimeout(2*time.Minute), WithRecheck(20*time.Millisecond))
	ma, mb := must(a.NewMutex("job")), must(b.NewMutex("job"))
	if err := ma.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- mb.Lock(lctx) }()
	eventually(t, 5*time.Second, "b to queue", func() bool { return len(queuedTickets(t, mr, k)) == 1 })
	mr.SetTime(t0.Add(61 * time.Second)) // a's lease runs out: nobody releases
	mr.FastForward(61 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mr.SetTime(t0.Add(61*time.Second + 61*time.Minute)) // no renewal: past b's max hold
	mr.FastForward(61 * time.Minute)
	st, err := b.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if st.Holder == nil || st.Holder.Label != "b" {
		t.Fatalf("holder %+v; want b, whose lease is 2h", st.Holder)
	}
	if st.Holder.Token != mb.Token() {
		t.Errorf("InspectLock: holder's token %d, want b's %d (lock TTL %v)", st.Holder.Token, mb.Token(), mr.TTL(k.Hash))
	}
	_ = mb.Unlock(ctx)
}

// The lock's hash, which keeps its last token, lives an hour at least
// past the hold's lease, however the lease was set: by the grant, Extend
// or a renewal (lock_lib.lua, keep_state); and a Redlock's raise of the
// token is kept in it.
func TestTokenOutlivesTheLease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")

	t.Run("mint", func(t *testing.T) {
		m := must(newClient(t, rdb).NewMutex("job", WithFixedLease(2*time.Hour)))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		if ttl := mr.TTL(k.Hash); ttl < 3*time.Hour-time.Second {
			t.Errorf("state TTL %v after a 2h hold was minted, want 2h + 1h at least", ttl)
		}
	})
	t.Run("extend", func(t *testing.T) {
		m := must(newClient(t, rdb).NewMutex("job", WithFixedLease(time.Second)))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		if err := m.Extend(ctx, 3*time.Hour); err != nil {
			t.Fatal(err)
		}
		if ttl := mr.TTL(k.Hash); ttl < 4*time.Hour-time.Second {
			t.Errorf("state TTL %v after Extend(3h), want 3h + 1h at least", ttl)
		}
	})
	t.Run("renew", func(t *testing.T) {
		lease := 300 * time.Millisecond
		m := must(newClient(t, rdb, WithCrashTimeout(lease)).NewMutex("job"))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Unlock(ctx) }()
		// As an hour into a long hold: the state about to run out.
		soon := time.Now().Add(time.Second)
		mr.HSet(k.Hash, schema.ExpiresField, strconv.FormatInt(soon.UnixMilli(), 10))
		mr.SetTTL(k.Hash, time.Second)
		eventually(t, 5*time.Second, "a renewal to keep the state", func() bool { return mr.TTL(k.Hash) >= time.Hour })
	})
	t.Run("redlock raise", func(t *testing.T) {
		c := newClient(t, rdb)
		m := must(c.NewMutex("job", WithFixedLease(2*time.Hour)))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := redlockRaiseScript.Run(ctx, rdb, []string{k.Hash}, m.holdID(), m.Token()+1000).Err(); err != nil {
			t.Fatal(err)
		}
		if tok := lockStateOf(t, mr, k).Token; tok != m.Token()+1000 {
			t.Errorf("last token %d after a raise to %d", tok, m.Token()+1000)
		}
		if ttl := mr.TTL(k.Hash); ttl < 3*time.Hour-time.Second {
			t.Errorf("state TTL %v after a raise during a 2h hold", ttl)
		}
		raised := m.Token() + 1000
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		next := must(c.NewMutex("job"))
		if err := next.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = next.Unlock(ctx) }()
		if next.Token() <= raised {
			t.Errorf("the next hold's token %d, want above the raised %d", next.Token(), raised)
		}
	})
}
