package redisync

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Issue 19, point 3: a semaphore is resized in place, and never lets more
// permits out than its new size.
func TestResizeSemaphore(t *testing.T) {
	t.Run("grow", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb, WithRecheck(time.Hour))
		x, w := must(c.NewSemaphore("s", 2)), must(c.NewSemaphore("s", 2))
		if err := x.Acquire(ctx, 2); err != nil {
			t.Fatal(err)
		}
		done := acquireAsync(ctx, w, 1)
		eventually(t, 5*time.Second, "w to queue", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
		if err := c.ResizeSemaphore(ctx, "s", 2, 3); err != nil {
			t.Fatal(err)
		}
		if err := result(t, done); err != nil { // granted by the resize
			t.Fatal(err)
		}
		if ok, err := x.TryAcquire(ctx, 1); ok || err != nil || x.Size() != 3 {
			t.Fatalf("a value of the old size: %v, %v, size %d; want false, nil, 3", ok, err, x.Size())
		}
		if ok, err := must(c.NewSemaphore("s", 3)).TryAcquire(ctx, 1); ok || err != nil {
			t.Fatalf("a fourth permit of 3: %v, %v", ok, err)
		}
	})
	t.Run("shrink", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb, WithRecheck(time.Hour))
		a := must(c.NewSemaphore("s", 3))
		if err := a.Acquire(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if err := c.ResizeSemaphore(ctx, "s", 3, 1); err != nil {
			t.Fatal(err)
		}
		if ok, err := must(c.NewSemaphore("s", 1)).TryAcquire(ctx, 1); ok || err != nil {
			t.Fatalf("TryAcquire(1) of size 1 while 3 are held: %v, %v", ok, err)
		}
		b := must(c.NewSemaphore("s", 1))
		done := acquireAsync(ctx, b, 1)
		eventually(t, 5*time.Second, "b to queue", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
		// a, opened with the old size, still gives its permits back; the
		// stored size rules who gets them.
		if err := a.Release(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if queueLen(t, mr) != 1 || b.Held() != 0 {
			t.Fatal("a release left 1 permit in use of a size of 1, and granted another")
		}
		if err := a.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := result(t, done); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb)
		if ok, err := must(c.NewSemaphore("s", 3)).TryAcquire(ctx, 1); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if err := c.ResizeSemaphore(ctx, "s", 5, 6); !errors.Is(err, ErrSizeMismatch) {
			t.Fatalf("resize from 5 of a semaphore of 3: %v, want ErrSizeMismatch", err)
		}
		if v := mr.HGet(semKey, "{size}"); v != "3:"+strconv.Itoa(schema.SemLayout) {
			t.Fatalf("stored size %q after a refused resize", v)
		}
	})
	t.Run("invalid input", func(t *testing.T) {
		_, rdb, cnt := newMini(t)
		c := newClient(t, rdb)
		for _, tc := range []struct {
			name     string
			from, to int64
			want     error
		}{
			{"", 1, 2, ErrInvalidName},
			{"s", 0, 2, ErrInvalidPermits},
			{"s", 2, 0, ErrInvalidPermits},
			{"s", 2, -1, ErrInvalidPermits},
		} {
			if err := c.ResizeSemaphore(ctx, tc.name, tc.from, tc.to); !errors.Is(err, tc.want) {
				t.Errorf("ResizeSemaphore(%q, %d, %d): %v, want %v", tc.name, tc.from, tc.to, err, tc.want)
			}
		}
		if n := cnt.n.Load(); n != 0 {
			t.Errorf("%d commands reached Redis", n)
		}
	})
}

// A Semaphore asked for more permits than the stored size fails with
// ErrInvalidPermits, whose message gives the stored size; ResizeSemaphore
// from a size not stored fails with ErrSizeMismatch, giving both sizes.
func TestSizeMismatchNamesResizeSemaphore(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	if ok, err := must(c.NewSemaphore("s", 2)).TryAcquire(ctx, 1); !ok || err != nil {
		t.Fatalf("TryAcquire: %v, %v", ok, err)
	}
	_, err := must(c.NewSemaphore("s", 3)).TryAcquire(ctx, 3)
	if !errors.Is(err, ErrInvalidPermits) || !strings.Contains(err.Error(), "size 2 stored") {
		t.Fatalf("TryAcquire of 3 with size 2 stored: %v; want ErrInvalidPermits with the stored size", err)
	}
	err = c.ResizeSemaphore(ctx, "s", 3, 4)
	if !errors.Is(err, ErrSizeMismatch) || !strings.Contains(err.Error(), "resizing from 3, stored size 2") {
		t.Fatalf("ResizeSemaphore from a size not stored: %v; want ErrSizeMismatch with both sizes", err)
	}
}
