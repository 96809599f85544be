package redisync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/layout2"
	"github.com/redisync/redisync/internal/redistest"
)

// During a rolling deploy from layout 2, a process of each layout takes
// the same lock on the same Redis: neither takes a lock the other holds,
// each fails with a layout error instead, and tokens keep increasing
// across the upgrade.
func TestUpgradeLayout2To3(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	old := layout2.NewClient(rdb, layout2.DefaultPrefix)
	t.Cleanup(func() { _ = old.Close() })
	c := newClient(t, rdb)
	name := fmt.Sprintf("upgrade-%d", time.Now().UnixNano())

	// Held by layout 2: layout 3 takes nothing and says why.
	om := old.NewMutex(name)
	if err := om.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	m := c.NewMutex(name)
	if ok, err := m.TryLock(ctx); ok || !errors.Is(err, ErrLayout) {
		t.Fatalf("TryLock of a layout 2 hold: %v, %v; want ErrLayout", ok, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := m.Lock(lctx)
	cancel()
	if !errors.Is(err, ErrLayout) {
		t.Fatalf("Lock of a layout 2 hold: %v; want ErrLayout at once", err)
	}
	last := om.Token()
	if err := om.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Free: layout 3 takes it, with a larger token than layout 2's last.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Token() <= last {
		t.Fatalf("layout 3 token %d after layout 2's %d", m.Token(), last)
	}
	// Held by layout 3, and free with its state kept: layout 2 fails.
	for _, held := range []bool{true, false} {
		if !held {
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := old.NewMutex(name).TryLock(ctx); ok || err == nil || !strings.Contains(err.Error(), "LAYOUT") {
			t.Fatalf("layout 2 TryLock (held %v): %v, %v; want its layout error", held, ok, err)
		}
	}
}

// Goroutines of both layouts contend for one lock that starts free: the
// holders' intervals never overlap, and every failure is a layout error
// (once layout 3 made the lock's state, layout 2 takes it no more).
func TestUpgradeLayout2And3NeverBothHold(t *testing.T) {
	rdb := redistest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	old := layout2.NewClient(rdb, layout2.DefaultPrefix)
	t.Cleanup(func() { _ = old.Close() })
	c := newClient(t, rdb)
	name := fmt.Sprintf("both-%d", time.Now().UnixNano())

	var inside atomic.Int64
	var held [2]atomic.Int64
	var wg sync.WaitGroup
	fail := func(format string, args ...any) { t.Errorf(format, args...); cancel() }
	section := func(layout int) {
		if n := inside.Add(1); n != 1 {
			fail("layout %d entered with %d inside", layout+2, n-1)
		}
		held[layout].Add(1)
		time.Sleep(100 * time.Microsecond)
		inside.Add(-1)
	}
	type locker interface {
		TryLock(context.Context) (bool, error)
		Unlock(context.Context) error
	}
	run := func(layout int, l locker) {
		defer wg.Done()
		for ctx.Err() == nil {
			ok, err := l.TryLock(ctx)
			switch {
			case err != nil && ctx.Err() == nil && !errors.Is(err, ErrLayout) && !strings.Contains(err.Error(), "LAYOUT"):
				fail("layout %d: %v", layout+2, err)
			case ok:
				section(layout)
				if err := l.Unlock(context.Background()); err != nil {
					fail("layout %d Unlock: %v", layout+2, err)
				}
			default:
				time.Sleep(time.Millisecond)
			}
		}
	}
	wg.Add(8)
	for range 4 {
		go run(0, old.NewMutex(name))
	}
	// Layout 3 comes later, as a deploy's new processes do, into a lock
	// that layout 2 holds most of the time.
	for held[0].Load() < 50 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	for range 4 {
		go run(1, c.NewMutex(name))
	}
	wg.Wait()
	if held[0].Load() < 50 || held[1].Load() == 0 {
		t.Fatalf("holds: layout 2 %d, layout 3 %d; want both to hold", held[0].Load(), held[1].Load())
	}
	t.Logf("holds: layout 2 %d, layout 3 %d", held[0].Load(), held[1].Load())
}
