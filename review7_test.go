package redisync

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// HoldContext says the context is cancelled "the moment" the hold ends
// (by the time Lost closes): it is cancelled later, by a goroutine, so a
// holder that sees Lost closed (or a call return ErrLockLost) still finds
// the hold's context live. One P, so that the goroutine cannot run before
// the test looks: what any scheduler may do.
func TestReview7HoldContextLiveAfterLostCloses(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := c.NewMutex("job")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	mr.Del("redisync:lock:{job}")
	if _, err := m.TTL(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("TTL: %v, want ErrLockLost", err)
	}
	if !isClosed(m.Lost()) {
		t.Fatal("Lost not closed after TTL reported the loss")
	}
	if err := hctx.Err(); err == nil {
		t.Fatalf("Lost is closed, but the hold's context is not done (cause %v): it is cancelled later, not by the time Lost closes", context.Cause(hctx))
	}
}

// Do on a value shared by goroutines: fn's hold is lost, and another
// goroutine's Lock of the value takes the lock anew (point 7: the Unlocks
// owed to the lost hold are not owed any more). Do's Unlock then releases
// the other goroutine's new hold: it runs unprotected, and its own Unlock
// finds nothing.
func TestReview7DoUnlocksAnotherGoroutinesNewHold(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWatchdogLease(150*time.Millisecond))
	m := c.NewMutex("job")
	err := m.Do(ctx, func(hctx context.Context) error {
		mr.Del("redisync:lock:{job}")
		<-hctx.Done()
		done := make(chan error)
		go func() { done <- m.Lock(ctx) }() // another goroutine of the value
		if err := <-done; err != nil {
			t.Error(err)
		}
		return context.Cause(hctx)
	})
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("Do: %v, want ErrLockLost", err)
	}
	if m.Token() == 0 || !mr.Exists("redisync:lock:{job}") {
		t.Fatalf("after Do, the other goroutine's Lock (not unlocked yet) holds nothing: token %d, key exists %v", m.Token(), mr.Exists("redisync:lock:{job}"))
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("the other goroutine's Unlock: %v", err)
	}
}

// Close loses every hold: its context's cause is ErrLockLost. An Unlock
// that runs once the Client is closing, before the watchdog drops the
// holds, forgets the hold as released instead: the cause is ErrReleased.
func TestReview7UnlockDuringCloseEndsAsReleased(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMutex("job")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	c.close() // Close has begun: the Client is closed, the watchdog not stopped yet
	if err := m.Unlock(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Unlock: %v, want ErrClosed", err)
	}
	_ = c.Close()
	mr.Del("redisync:lock:{job}") // see TestReview7UnlockDuringCloseLeavesTheLock
	<-hctx.Done()
	if !errors.Is(context.Cause(hctx), ErrLockLost) {
		t.Fatalf("closed: cause %v, want ErrLockLost (holds are lost with the Client)", context.Cause(hctx))
	}
}

// (Older than HEAD.) The same Unlock removes the hold from the watchdog
// without sending its release, so Close does not release it either: the
// lock stays in Redis for its lease, though Close promises every hold is
// released.
func TestReview7UnlockDuringCloseLeavesTheLock(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMutex("job")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	c.close()
	_ = m.Unlock(ctx)
	_ = c.Close()
	if mr.Exists("redisync:lock:{job}") {
		mr.Del("redisync:lock:{job}")
		t.Fatal("after Close, the lock is still in Redis: neither Unlock nor Close released it")
	}
}
