package redisync

import (
	"errors"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// heldPast checks, until lease has passed twice since start, that Lost is
// open and that try, another value's Try call, stays false; then it waits
// (at most 5 s) for Lost to close and for try to succeed.
func heldPast(t *testing.T, start time.Time, lease time.Duration, lost <-chan struct{}, try func() (bool, error)) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < 2*lease {
		if isClosed(lost) {
			t.Fatalf("lost %v after the start, within the extension", time.Since(start))
		}
		if ok, err := try(); ok || err != nil {
			t.Fatalf("another value's Try %v after the start: %v, %v; want false, nil", time.Since(start), ok, err)
		}
		<-tick.C
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost still open 5 s after the extension ended")
	}
	eventually(t, 5*time.Second, "another value to get in", func() bool {
		ok, err := try()
		return ok && err == nil
	})
}

// Permits with a fixed lease, extended past it, stay held while another
// value's TryAcquire stays false, and are lost after the extension ends.
func TestSemaphoreExtendKeepsFixedLease(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb, WithKeyPrefix(redistest.Name(t)))
	const lease = 300 * time.Millisecond
	s := must(c.NewSemaphore("s", 2, WithFixedLease(lease)))
	other := must(c.NewSemaphore("s", 2))
	start := time.Now()
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, 3*lease); err != nil {
		t.Fatal(err)
	}
	ttl, err := s.TTL(ctx)
	if err != nil || ttl <= 2*lease || ttl > 3*lease {
		t.Fatalf("TTL after Extend(%v): %v, %v", 3*lease, ttl, err)
	}
	if err := s.Extend(ctx, lease/3); err != nil { // never shortens
		t.Fatal(err)
	}
	if ttl, err := s.TTL(ctx); err != nil || ttl <= 2*lease-lease/2 {
		t.Fatalf("TTL after a shorter Extend: %v, %v; want the longer lease kept", ttl, err)
	}
	heldPast(t, start, lease, s.Lost(), func() (bool, error) {
		ok, err := other.TryAcquire(ctx, 1)
		if ok {
			err = errors.Join(err, other.Release(ctx, 1))
		}
		return ok, err
	})
	if err := s.Extend(ctx, lease); !errors.Is(err, ErrLockLost) {
		t.Errorf("Extend of lost permits: %v, want ErrLockLost", err)
	}
	if _, err := s.TTL(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("TTL of lost permits: %v, want ErrLockLost", err)
	}
	_ = s.Release(ctx, 2)
}

// Extend and TTL with nothing held, or a lease outside [1ms, MaxLease],
// fail before any call to Redis.
func TestSemaphoreExtendNotHeldOrBadLease(t *testing.T) {
	_, rdb, calls := newMini(t)
	c := newClient(t, rdb)
	s := must(c.NewSemaphore("s", 2))
	before := calls.n.Load()
	if err := s.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend with nothing held: %v, want ErrNotHeld", err)
	}
	if _, err := s.TTL(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("TTL with nothing held: %v, want ErrNotHeld", err)
	}
	for _, lease := range []time.Duration{0, time.Microsecond, MaxLease + time.Millisecond} {
		if err := s.Extend(ctx, lease); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("Extend(%v): %v, want ErrInvalidOption", lease, err)
		}
	}
	if n := calls.n.Load() - before; n != 0 {
		t.Errorf("%d commands reached Redis, want 0", n)
	}
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, 0); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Extend(0) while held: %v, want ErrInvalidOption", err)
	}
	if ttl, err := s.TTL(ctx); err != nil || ttl <= 0 {
		t.Errorf("TTL while held: %v, %v", ttl, err)
	}
	// A partial release re-arms the lease, and keeps a longer one that
	// Extend set.
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ttl, err := s.TTL(ctx); err != nil || ttl <= 59*time.Minute {
		t.Errorf("TTL after Extend(1h) and a partial Release: %v, %v; want about 1h", ttl, err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}
