package redisync

import (
	"testing"
	"time"
)

// Issue 19, point 5: nothing redisync writes stays in Redis for good. After
// every primitive was used (contended, queued, released), every key left
// has a TTL: the fencing token counter and a semaphore's size included.
func TestNothingLeftWithoutTTL(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	for _, opts := range [][]MutexOption{{Barging()}, nil} {
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
