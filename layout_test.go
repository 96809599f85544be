package redisync

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Issue 15, point 3: state written in another layout (an older or newer
// redisync on the same Redis) fails loudly, with ErrLayout, and the call
// holds nothing; state that is idle is taken over.
func TestLayoutOfAHeldLockIsChecked(t *testing.T) {
	for _, tt := range []struct {
		name, mark, says string
	}{
		{"layout 1 (unmarked)", "", "layout 1"},
		{"a newer layout", "3", "layout 3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			c := newClient(t, rdb)
			key := schema.LockKeys("redisync", "job").Hash
			mr.HSet(key, "other-version/abc-1", "1")
			if tt.mark != "" {
				mr.HSet(key, schema.LayoutField, tt.mark)
			}
			mr.SetTTL(key, time.Minute)
			before := mr.Dump()
			for _, m := range []*Mutex{c.NewMutex("job", Barging()), c.NewMutex("job")} {
				if ok, err := m.TryLock(ctx); ok || !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), tt.says) {
					t.Errorf("TryLock: %v, %v; want ErrLayout naming %s", ok, err, tt.says)
				}
				lctx, cancel := context.WithTimeout(ctx, 2*time.Second) // fail, not hang, if it waited
				err := m.Lock(lctx)
				cancel()
				if !errors.Is(err, ErrLayout) || strings.Contains(err.Error(), "\n") {
					t.Errorf("Lock: %v; want ErrLayout on one line", err)
				}
			}
			// Each call that failed withdrew its ticket (a withdrawn
			// ticket is remembered for a while, with a TTL); nothing else
			// changed.
			ws := withdrawnTickets(t, mr, schema.LockKeys("redisync", "job"))
			if len(ws) != 4 {
				t.Errorf("withdrawn tickets %q, want the 4 failed calls'", ws)
			}
			for _, w := range ws {
				mr.Del(w)
			}
			if after := mr.Dump(); after != before {
				t.Errorf("state changed:\n%s\nwant\n%s", after, before)
			}
			st, err := c.InspectLock(ctx, "job")
			if err != nil || st.Holder == nil || st.Holder.ID != "other-version/abc-1" {
				t.Errorf("inspect: %+v, %v; want the other version's holder", st, err)
			}
		})
	}
}

func TestLayoutOfAFreeLockIsTakenOver(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	k := schema.LockKeys("redisync", "job")
	// What layout 1 leaves once released: a token counter.
	last := time.Now().Add(time.Hour).UnixMicro()
	if err := mr.Set(k.Token, strconv.FormatInt(last, 10)); err != nil {
		t.Fatal(err)
	}
	m := c.NewMutex("job")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Token() != last+1 {
		t.Errorf("token %d, want %d: the counter of layout 1 goes on", m.Token(), last+1)
	}
	if ids := holdIDs(t, mr, k.Hash); len(ids) != 1 || ids[0] != m.holdID() {
		t.Errorf("hold ids %q", ids)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestLayoutOfASemaphoreIsChecked(t *testing.T) {
	k := schema.SemaphoreKeys("redisync", "pool")
	t.Run("busy, layout 1", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb)
		if err := mr.Set(k.Size, "5"); err != nil {
			t.Fatal(err)
		}
		mr.HSet(k.Holders, "other-version/abc-1", "2:1")
		before := mr.Dump()
		s := c.NewSemaphore("pool", 5)
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := s.Acquire(actx, 1); !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "layout 1") {
			t.Errorf("Acquire: %v; want ErrLayout", err)
		}
		if ok, err := s.TryAcquire(ctx, 1); ok || !errors.Is(err, ErrLayout) {
			t.Errorf("TryAcquire: %v, %v; want ErrLayout", ok, err)
		}
		if err := c.ResizeSemaphore(ctx, "pool", 5, 6); !errors.Is(err, ErrLayout) {
			t.Errorf("ResizeSemaphore: %v; want ErrLayout", err)
		}
		mr.Del(k.Withdrawn)
		if after := mr.Dump(); after != before {
			t.Errorf("state changed:\n%s\nwant\n%s", after, before)
		}
	})
	t.Run("busy, a newer layout", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb)
		if err := mr.Set(k.Size, "5:3"); err != nil {
			t.Fatal(err)
		}
		mr.ZAdd(k.Queue, 1, "other-version/abc-1#1")
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := c.NewSemaphore("pool", 5).Acquire(actx, 1); !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "layout 3") {
			t.Errorf("Acquire: %v; want ErrLayout", err)
		}
	})
	t.Run("idle, layout 1", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb)
		if err := mr.Set(k.Size, "5"); err != nil {
			t.Fatal(err)
		}
		s := c.NewSemaphore("pool", 3) // an idle semaphore's old size does not bind
		if err := s.Acquire(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if v, _ := mr.Get(k.Size); v != "3:"+strconv.Itoa(schema.Layout) {
			t.Errorf("size record %q after taking an idle semaphore over", v)
		}
		if err := s.Release(ctx, 3); err != nil {
			t.Fatal(err)
		}
	})
}

// layout1Script loads a script of layout 1 (redisync at c15c6cd, before
// layouts were numbered), as an older version in a rolling deploy runs it.
func layout1Script(t *testing.T, name string) *luaScript {
	t.Helper()
	lib, err := os.ReadFile("testdata/layout1/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile("testdata/layout1/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return testScript(string(lib) + string(body))
}

func mustGet(t *testing.T, mr interface{ Get(string) (string, error) }, key string) string {
	t.Helper()
	v, err := mr.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Review 8, finding 1. A fair queue shared by an old and a new version: the
// old version's release hands the lock to a new-version waiter with a
// hash that has no layout mark. That hold is a new version's, renewed by
// its watchdog for as long as it likes; yet every other new-version call
// gets ErrLayout ("layout 1") for the whole hold, long after the old
// version is gone. docs/upgrading.md says ErrLayout lasts "at most their
// lease after the last old instance stops".
func TestLayoutHoldHandedOverByLayout1StaysUnmarked(t *testing.T) {
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
	cb := newClient(t, rdb, WithLabel("new-waiter"), WithCrashTimeout(lease), WithRecheck(100*time.Millisecond))
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

// Review 8, finding 3: a refused call holds nothing and leaves only the
// record of its withdrawn ticket (with a TTL): an error reply may answer
// go-redis's retry of a copy that ran, so the call is withdrawn, as any
// call that failed after it was sent (docs/upgrading.md says so).
func TestLayoutRefusalHoldsNothing(t *testing.T) {
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
	if m.Token() != 0 || m.Lost() != notHeld {
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
