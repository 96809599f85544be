package redisync

import (
	"context"
	"errors"
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
