package redisync

import (
	"errors"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// A write with a fixed lease, extended past it, stays held while another
// value's TryLock and TryRLock stay false, and is lost after the extension
// ends.
func TestRWMutexExtendKeepsFixedLease(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb, WithKeyPrefix(redistest.Name(t)))
	const lease = 300 * time.Millisecond
	rw := must(c.NewRWMutex("rw", WithFixedLease(lease)))
	other := must(c.NewRWMutex("rw"))
	start := time.Now()
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := rw.Token()
	if err := rw.Extend(ctx, 3*lease); err != nil {
		t.Fatal(err)
	}
	if ttl, err := rw.TTL(ctx); err != nil || ttl <= 2*lease || ttl > 3*lease {
		t.Fatalf("TTL after Extend(%v): %v, %v", 3*lease, ttl, err)
	}
	if rw.Token() != token {
		t.Fatalf("Extend changed the token: %d, was %d", rw.Token(), token)
	}
	heldPast(t, start, lease, rw.Lost(), func() (bool, error) {
		if ok, err := other.TryRLock(ctx); ok || err != nil {
			if ok {
				err = errors.Join(err, other.RUnlock(ctx))
			}
			return ok, err
		}
		ok, err := other.TryLock(ctx)
		if ok {
			err = errors.Join(err, other.Unlock(ctx))
		}
		return ok, err
	})
	if err := rw.Extend(ctx, lease); !errors.Is(err, ErrLockLost) {
		t.Errorf("Extend of a lost write: %v, want ErrLockLost", err)
	}
	_ = rw.Unlock(ctx)
}

// Extend and TTL with no write held, or a lease outside [1ms, MaxLease],
// fail before any call to Redis; a read is no write.
func TestRWMutexExtendNotHeldOrBadLease(t *testing.T) {
	_, rdb, calls := newMini(t)
	c := newClient(t, rdb)
	rw := must(c.NewRWMutex("rw"))
	before := calls.n.Load()
	if err := rw.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend with nothing held: %v, want ErrNotHeld", err)
	}
	if _, err := rw.TTL(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("TTL with nothing held: %v, want ErrNotHeld", err)
	}
	for _, lease := range []time.Duration{0, MaxLease + time.Millisecond} {
		if err := rw.Extend(ctx, lease); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("Extend(%v): %v, want ErrInvalidOption", lease, err)
		}
	}
	if n := calls.n.Load() - before; n != 0 {
		t.Errorf("%d commands reached Redis, want 0", n)
	}
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend with a read held: %v, want ErrNotHeld", err)
	}
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl, err := rw.TTL(ctx); err != nil || ttl <= 9*time.Second {
		t.Errorf("TTL of the write after Extend(10s): %v, %v", ttl, err)
	}
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
