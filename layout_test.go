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

// State written in another layout (an older or newer redisync on the same
// Redis) fails loudly, with ErrLayout, and the call holds nothing; state
// that is idle is taken over.
func TestLayoutOfAHeldLockIsChecked(t *testing.T) {
	for _, tt := range []struct {
		name, mark, says string
	}{
		{"layout 1 (unmarked)", "", "layout 1"},
		{"layout 2", "2", "layout 2"},
		{"a newer layout", "4", "layout 4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			c := newClient(t, rdb)
			key := schema.LockKeys("redisync", "job").Hash
			// A hold as layouts 1 and 2 stored it: hold id -> count, with
			// the lease as the hash's TTL.
			mr.HSet(key, "other-version/abc-1", "1")
			if tt.mark != "" {
				mr.HSet(key, schema.LayoutField, tt.mark)
			}
			mr.SetTTL(key, time.Minute)
			before := mr.Dump()
			for _, m := range []*Mutex{must(c.NewMutex("job", Barging())), must(c.NewMutex("job"))} {
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
			// Each call that failed withdrew its ticket, as any call that
			// failed once sent: a withdrawal may leave the record of its
			// ticket (a tombstone, with a TTL), and nothing else.
			for _, w := range withdrawnTickets(t, mr, schema.LockKeys("redisync", "job")) {
				mr.Del(w)
			}
			if after := mr.Dump(); after != before {
				t.Errorf("state changed:\n%s\nwant\n%s", after, before)
			}
			// Inspecting an older layout's hold names its holder, so that an
			// operator sees who holds during a deploy; a newer layout's
			// fails rather than report the lock free.
			st, err := c.InspectLock(ctx, "job")
			switch {
			case tt.mark == "4" && err == nil:
				t.Errorf("inspect: %+v; want an error: the hash is of a newer layout", st)
			case tt.mark != "4" && (err != nil || st.Holder == nil || st.Holder.ID != "other-version/abc-1"):
				t.Errorf("inspect: %+v, %v; want the older layout's holder", st, err)
			}
		})
	}
}

func TestLayoutOfAFreeLockIsTakenOver(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	k := schema.LockKeys("redisync", "job")
	// What layouts 1 and 2 leave once released: no hash, and a token
	// counter in a key of its own.
	last := time.Now().Add(time.Hour).UnixMicro()
	if err := mr.Set(k.Hash+":token", strconv.FormatInt(last, 10)); err != nil {
		t.Fatal(err)
	}
	m := must(c.NewMutex("job"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Token() != last+1 {
		t.Errorf("token %d, want %d: the counter of layout 2 goes on", m.Token(), last+1)
	}
	if st := lockStateOf(t, mr, k); st.Owner != m.holdID() || st.Token != m.Token() {
		t.Errorf("lock state %+v, want held by %s with token %d", st, m.holdID(), m.Token())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestLayoutOfASemaphoreIsChecked(t *testing.T) {
	k := schema.SemaphoreKeys("redisync", "pool")
	live := func() float64 { return float64(time.Now().Add(time.Hour).UnixMilli()) }
	// refused: every call on the semaphore fails with ErrLayout naming
	// layout says, and writes nothing.
	refused := func(t *testing.T, mr interface{ Dump() string }, c *Client, says string) {
		t.Helper()
		before := mr.Dump()
		s := must(c.NewSemaphore("pool", 5))
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := s.Acquire(actx, 1); !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "layout "+says) {
			t.Errorf("Acquire: %v; want ErrLayout naming layout %s", err, says)
		}
		if ok, err := s.TryAcquire(ctx, 1); ok || !errors.Is(err, ErrLayout) {
			t.Errorf("TryAcquire: %v, %v; want ErrLayout", ok, err)
		}
		if err := c.ResizeSemaphore(ctx, "pool", 5, 6); !errors.Is(err, ErrLayout) {
			t.Errorf("ResizeSemaphore: %v; want ErrLayout", err)
		}
		if after := mr.Dump(); after != before {
			t.Errorf("state changed:\n%s\nwant\n%s", after, before)
		}
	}
	t.Run("busy, layout 4", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		mr.HSet(k.Hash, "other-version/abc-1", "2:1", schema.SemUsedField, "2", "{size}", "5:4")
		if _, err := mr.ZAdd(k.Expiry, live(), "other-version/abc-1"); err != nil {
			t.Fatal(err)
		}
		refused(t, mr, newClient(t, rdb), "4")
	})
	t.Run("a newer layout, idle or not", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		newer := strconv.Itoa(schema.SemLayout + 1)
		mr.HSet(k.Hash, "{size}", "5:"+newer)
		refused(t, mr, newClient(t, rdb), newer)
	})
	t.Run("busy, layout 3", func(t *testing.T) { // v1.0.0: a bare count, its size in a key of its own
		mr, rdb, _ := newMini(t)
		mr.HSet(k.Hash, "other-version/abc-1", "2:1", schema.SemUsedField, "2")
		if _, err := mr.ZAdd(k.Expiry, live(), "other-version/abc-1"); err != nil {
			t.Fatal(err)
		}
		refused(t, mr, newClient(t, rdb), "3")
	})
	t.Run("idle, layout 3: its ended holders are reclaimed", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb)
		mr.HSet(k.Hash, "ended/abc-1", "2:1", schema.SemUsedField, "2")
		if _, err := mr.ZAdd(k.Expiry, 1, "ended/abc-1"); err != nil { // a lease long over
			t.Fatal(err)
		}
		s := must(c.NewSemaphore("pool", 2))
		if ok, err := s.TryAcquire(ctx, 2); !ok || err != nil {
			t.Fatalf("TryAcquire(2) of the idle semaphore: %v, %v", ok, err)
		}
		if v := mr.HGet(k.Hash, schema.SemUsedField); v != "2:"+strconv.Itoa(schema.SemLayout) {
			t.Errorf("count %q after the takeover, want 2:%d", v, schema.SemLayout)
		}
		if v := mr.HGet(k.Hash, "ended/abc-1"); v != "" {
			t.Errorf("the ended holder's record %q is still there", v)
		}
		for _, key := range []string{k.Hash, k.Expiry} {
			if ttl := mr.TTL(key); ttl < time.Hour {
				t.Errorf("TTL of %s %v after the takeover, want an hour or more", key, ttl)
			}
		}
		if err := s.Release(ctx, 2); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("idle, layout 4", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		c := newClient(t, rdb)
		mr.HSet(k.Hash, "{size}", "5:4", "{keep}", "1", "{prune}", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10))
		mr.SetTTL(k.Hash, time.Second)                                 // layout 4's TTLs may be short
		if _, err := mr.ZAdd(k.Expiry, 1, "ended/abc-1"); err != nil { // a lease long over
			t.Fatal(err)
		}
		s := must(c.NewSemaphore("pool", 3)) // an idle semaphore's old size does not bind
		if err := s.Acquire(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if v := mr.HGet(k.Hash, "{size}"); v != "3:"+strconv.Itoa(schema.SemLayout) {
			t.Errorf("size record %q after taking an idle semaphore over", v)
		}
		if err := s.Release(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if ttl := mr.TTL(k.Hash); ttl < time.Hour {
			t.Errorf("TTL of the hash %v after the takeover, want an hour or more", ttl)
		}
		if !mr.Exists(k.Ended) || mr.TTL(k.Ended) <= 0 {
			t.Errorf("the ended zset after the takeover: exists %v, TTL %v; want one with a TTL", mr.Exists(k.Ended), mr.TTL(k.Ended))
		}
	})
}

// layout2Script loads a script of layout 2 (redisync at a868dfa, before
// a lock's state was one hash), as an older version in a rolling deploy
// runs it.
func layout2Script(t *testing.T, name string) *luaScript {
	t.Helper()
	lib, err := os.ReadFile("testdata/layout2/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile("testdata/layout2/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return testScript(string(lib) + string(body))
}

// An older version (layout 2) that meets a lock of layout 3, held or
// released (a release leaves the hash), fails with its LAYOUT error and
// changes nothing: it never takes a lock that this version holds, nor
// misreads one it released.
func TestLayout2ScriptsRefuseALayout3Lock(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")
	c := newClient(t, rdb)
	m := must(c.NewMutex("job"))
	acquire := layout2Script(t, "acquire.lua")
	old := "old-version/abc-1"
	for _, held := range []bool{true, false} {
		if held {
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		before := mr.Dump()
		for _, mode := range []string{"barge", "queue", "try"} {
			// Layout 2's keys and arguments (testdata/layout2/acquire.lua).
			err := acquire.Run(ctx, rdb,
				[]string{k.Hash, k.Hash + ":token", k.Queue, k.Hash + ":waiters", k.Tombstone(old), k.Bargers},
				old, 10000, mode, 3000, 10000, k.Channel, "PUBLISH", "", "", "0", "0").Err()
			if err == nil || !strings.Contains(err.Error(), "written in layout 3") {
				t.Errorf("held %v, layout 2's %s: %v; want its LAYOUT error naming layout 3", held, mode, err)
			}
		}
		if after := mr.Dump(); after != before {
			t.Errorf("held %v: layout 2's calls changed the state:\n%s\nwant\n%s", held, after, before)
		}
		if held {
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A refused call holds nothing and leaves only the record of its
// withdrawn ticket (with a TTL): an error reply may answer go-redis's
// retry of a copy that ran, so the call is withdrawn, as any call that
// failed after it was sent (docs/upgrading.md says so).
func TestLayoutRefusalHoldsNothing(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	k := schema.LockKeys("redisync", "job")
	warm := must(c.NewMutex("warm-up")) // loads the scripts: one EVALSHA each from here on
	if err := warm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.HSet(k.Hash, "other-version/abc-1", "1", schema.LayoutField, "2")
	mr.SetTTL(k.Hash, time.Minute)
	before := mr.Dump()
	n0 := cnt.n.Load()
	m := must(c.NewMutex("job"))
	if ok, err := m.TryLock(ctx); ok || !errors.Is(err, ErrLayout) {
		t.Fatalf("TryLock: %v, %v; want ErrLayout", ok, err)
	}
	_ = c.Close() // waits for any clean-up still under way
	if m.Token() != 0 || m.Lost() != notHeld {
		t.Error("a refused TryLock holds")
	}
	ws := withdrawnTickets(t, mr, k)
	if len(ws) > 1 {
		t.Errorf("withdrawn tickets %q, want at most the refused TryLock's", ws)
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
