package layout2

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// TestScriptsFrozen keeps the copies of the layout-2 scripts as they were
// at a868dfa: the driver stands for that version, and must not follow
// scripts/.
func TestScriptsFrozen(t *testing.T) {
	for name, want := range map[string]struct{ src, sum string }{
		"lib.lua":     {luaLib, "8115f14663af9e26c306ae8aa15161a2536e577051f029ccb2be41b25d4a83d7"},
		"acquire.lua": {luaAcquire, "7d21373dac40ca9175f5cd0c6ed54fa099aac9dba4ceb9bd0ec93683f9848579"},
		"release.lua": {luaRelease, "f6437aa13e37c7399e79bcc871e8ca1acc25f9c5346f2ee5e28149bf6d0a6c59"},
		"renew.lua":   {luaRenew, "0666ba78201e443c143ab48950ff966856b5c43a0a7d4ac151ce40836314443f"},
	} {
		sum := sha256.Sum256([]byte(want.src))
		if got := hex.EncodeToString(sum[:]); got != want.sum {
			t.Errorf("scripts/%s has SHA-256 %s, want %s (the copy of a868dfa)", name, got, want.sum)
		}
	}
}

// newClient returns a Client on the package's Redis, closed when the test
// ends, with a prefix of the test's own.
func newClient(t *testing.T, prefix string) *Client {
	t.Helper()
	c := NewClient(redistest.Client(t), prefix)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestExclusion(t *testing.T) {
	prefix, name := redistest.Name(t), "lock"
	const clients, goroutines, rounds = 3, 4, 25
	var inside atomic.Int32
	var mu sync.Mutex
	last := int64(0)
	var wg sync.WaitGroup
	for range clients {
		c := newClient(t, prefix)
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.NewMutex(name)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for range rounds {
					if err := m.Lock(ctx); err != nil {
						t.Error(err)
						return
					}
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					mu.Lock()
					if tok := m.Token(); tok <= last {
						t.Errorf("token %d after %d", tok, last)
					} else {
						last = tok
					}
					mu.Unlock()
					time.Sleep(100 * time.Microsecond)
					inside.Add(-1)
					if err := m.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	rdb := redistest.Client(t)
	k := lockKeys(prefix, name)
	if n := rdb.Exists(context.Background(), k.hash, k.queue).Val(); n != 0 {
		t.Errorf("%d of the lock hash and queue left after the last Unlock", n)
	}
}

// TestGrant: a waiter is handed the lock by the release, told on its grant
// channel, long before it would look again by itself (the holder's lease
// is 15 s; the recheck 10 s).
func TestGrant(t *testing.T) {
	prefix := redistest.Name(t)
	a, b := newClient(t, prefix).NewMutex("x"), newClient(t, prefix).NewMutex("x")
	ctx := context.Background()
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Lock(ctx) }()
	time.Sleep(200 * time.Millisecond) // b queues
	released := time.Now()
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(released); d > time.Second {
		t.Errorf("the waiter took the lock %v after the release", d)
	}
	if b.Token() <= 0 {
		t.Errorf("token %d", b.Token())
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Unlock: %v, want ErrNotHeld", err)
	}
}

// TestHeartbeat: a waiter queued for longer than its own 3 s deadline is
// kept alive by its Client's heartbeat and handed the lock; once it left,
// a farewell removes the Client's deadline.
func TestHeartbeat(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 4 s")
	}
	prefix := redistest.Name(t)
	a := newClient(t, prefix).NewMutex("x")
	cb := newClient(t, prefix)
	b := cb.NewMutex("x")
	ctx := context.Background()
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Lock(ctx) }()
	time.Sleep(heartbeat + time.Second)
	rdb := redistest.Client(t)
	field := "{client}" + cb.id
	if !rdb.HExists(ctx, lockKeys(prefix, "x").waiters, field).Val() {
		t.Error("no heartbeat of the waiter's Client in the waiters hash")
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 3*time.Second, "the farewell", func() bool {
		return !rdb.HExists(ctx, lockKeys(prefix, "x").waiters, field).Val()
	})
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTryLock(t *testing.T) {
	prefix := redistest.Name(t)
	c := newClient(t, prefix)
	a, b := c.NewMutex("x"), c.NewMutex("x")
	ctx := context.Background()
	if ok, err := a.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock of a free lock: %v, %v", ok, err)
	}
	if ok, err := b.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock of a held lock: %v, %v", ok, err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after the Unlock: %v, %v", ok, err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCancelWithdraws: a Lock whose ctx ends leaves the queue, and the
// lock goes to the next waiter, not to it.
func TestCancelWithdraws(t *testing.T) {
	prefix := redistest.Name(t)
	ca, cb := newClient(t, prefix), newClient(t, prefix)
	a, b, d := ca.NewMutex("x"), cb.NewMutex("x"), cb.NewMutex("x")
	ctx := context.Background()
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := b.Lock(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with a short ctx: %v", err)
	}
	rdb := redistest.Client(t)
	k := lockKeys(prefix, "x")
	if n := rdb.ZCard(ctx, k.queue).Val(); n != 0 {
		t.Errorf("%d tickets queued after the withdrawal", n)
	}
	done := make(chan error, 1)
	go func() { done <- d.Lock(ctx) }()
	time.Sleep(200 * time.Millisecond)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if b.Token() != 0 {
		t.Error("the withdrawn call holds")
	}
	if err := d.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClose: a waiting Lock returns ErrClosed when its Client closes, and
// withdraws.
func TestClose(t *testing.T) {
	prefix := redistest.Name(t)
	a := newClient(t, prefix).NewMutex("x")
	cb := NewClient(redistest.Client(t), prefix)
	b := cb.NewMutex("x")
	ctx := context.Background()
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Lock(ctx) }()
	time.Sleep(200 * time.Millisecond)
	if err := cb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Lock during Close: %v, want ErrClosed", err)
	}
	if n := redistest.Client(t).ZCard(ctx, lockKeys(prefix, "x").queue).Val(); n != 0 {
		t.Errorf("%d tickets queued after Close", n)
	}
	if err := b.Lock(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Lock after Close: %v", err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
