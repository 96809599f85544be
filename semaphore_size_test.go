package redisync

import (
	"errors"
	"strconv"
	"testing"

	"github.com/redisync/redisync/internal/schema"
)

// A value made with the old size keeps working after ResizeSemaphore, with
// the new size, which Size reports from its next call on.
func TestSemaphoreAdoptsStoredSizeAfterResize(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	s := must(c.NewSemaphore("s", 2))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.ResizeSemaphore(ctx, "s", 2, 4); err != nil {
		t.Fatal(err)
	}
	if s.Size() != 2 {
		t.Fatalf("Size before a call = %d, want 2 (last seen)", s.Size())
	}
	if err := s.Acquire(ctx, 3); err != nil {
		t.Fatalf("Acquire of 3 more after a resize to 4: %v", err)
	}
	if s.Size() != 4 || s.Held() != 4 {
		t.Fatalf("Size %d, Held %d; want 4, 4", s.Size(), s.Held())
	}
	if err := c.ResizeSemaphore(ctx, "s", 4, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, 2); !errors.Is(err, ErrInvalidPermits) || s.Size() != 1 {
		t.Fatalf("Acquire of 2 after a shrink to 1: %v, size %d; want ErrInvalidPermits, 1", err, s.Size())
	}
	if ok, err := s.TryAcquire(ctx, 1); !ok || err != nil {
		t.Fatalf("TryAcquire of 1 of 1: %v, %v", ok, err)
	}
}

// An Acquire of more permits than the stored size fails with
// ErrInvalidPermits and writes nothing; the size given to NewSemaphore is
// the one stored when none is.
func TestSemaphoreMorePermitsThanStoredSize(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	if err := must(c.NewSemaphore("s", 3)).Acquire(ctx, 4); !errors.Is(err, ErrInvalidPermits) {
		t.Fatalf("Acquire of 4 of 3: %v, want ErrInvalidPermits", err)
	}
	if keys := mr.Keys(); len(keys) != 0 {
		t.Fatalf("an Acquire refused wrote %v", keys)
	}
	big := must(c.NewSemaphore("s", 5))
	if ok, err := big.TryAcquire(ctx, 5); !ok || err != nil {
		t.Fatalf("TryAcquire of 5 of 5 on a new semaphore: %v, %v", ok, err)
	}
	if got := mr.HGet(semKey, "{size}"); got != "5:"+strconv.Itoa(schema.SemLayout) {
		t.Fatalf("stored size %q, want 5:layout", got)
	}
	small := must(c.NewSemaphore("s", 2))
	if ok, err := small.TryAcquire(ctx, 3); ok || err != nil || small.Size() != 5 {
		t.Fatalf("TryAcquire of 3 with 5 stored and held: %v, %v, size %d; want false, nil, 5", ok, err, small.Size())
	}
}
