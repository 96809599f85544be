package redisync

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

// Issue 19, point 8: a hold is handed to another process atomically: new
// owner, new fencing token, the old holder's Lost closed, and never two
// holders at once.
func TestMutexHandoff(t *testing.T) {
	mr, rdb, _ := newMini(t)
	ca, cb := newClient(t, rdb), newClient(t, rdb)
	a, b := ca.NewMutex("job"), cb.NewMutex("job")
	key := "redisync:lock:{job}"
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(ctx); err != nil { // re-entered: the whole hold goes
		t.Fatal(err)
	}
	lost, token := a.Lost(), a.Token()
	handle, err := a.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the giver's Lost is open after Handoff returned")
	}
	if a.Token() != 0 || a.Lost() != nil {
		t.Fatal("the giver still holds after Handoff")
	}
	if f := holdIDs(t, mr, key); len(f) != 1 || f[0] != handle {
		t.Fatalf("lock fields %q, want the handle %q alone", f, handle)
	}
	if ok, err := cb.NewMutex("job").TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while the hold waits for its taker: %v, %v", ok, err)
	}
	if err := b.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	if b.Token() <= token || b.Lost() == nil {
		t.Fatalf("the taker's token %d (giver's %d), Lost %v", b.Token(), token, b.Lost())
	}
	if f := holdIDs(t, mr, key); len(f) != 1 || f[0] != b.holdID() || mr.HGet(key, f[0]) != "1" {
		t.Fatalf("lock fields %q, want the taker's hold alone, count 1", f)
	}
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("the giver's Unlock: %v, want ErrNotHeld", err)
	}
	// A handle is taken once.
	if err := ca.NewMutex("job").Accept(ctx, handle); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("a second Accept: %v, want ErrNotHeld", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if mr.Exists(key) {
		t.Fatal("the lock is left after the taker's Unlock")
	}
}

func TestMutexHandoffErrors(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb, WithWatchdogLease(200*time.Millisecond))
	m := c.NewMutex("job")
	if _, err := m.Handoff(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Handoff holding nothing: %v, want ErrNotHeld", err)
	}
	if err := m.Accept(ctx, ""); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Accept of an empty handle: %v, want ErrNotHeld", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Fatalf("%d commands reached Redis", n)
	}
	if err := m.Accept(ctx, "no-such-handle"); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Accept of an unknown handle: %v, want ErrNotHeld", err)
	}

	// Accept on a value that holds: refused before Redis, the hold waits.
	giver := c.NewMutex("other")
	if err := giver.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	handle, err := giver.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Accept(ctx, handle); !errors.Is(err, ErrHeld) {
		t.Fatalf("Accept on a holding value: %v, want ErrHeld", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Nobody accepts it in time: it runs out, and the lock is free.
	mr.FastForward(200 * time.Millisecond)
	if err := m.Accept(ctx, handle); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Accept after the hand-off ran out: %v, want ErrNotHeld", err)
	}

	// A lost hold cannot be handed off.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.Del("redisync:lock:{job}")
	eventually(t, 5*time.Second, "the hold to be lost", func() bool { return isClosed(m.Lost()) })
	if _, err := m.Handoff(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Handoff of a lost hold: %v, want ErrLockLost", err)
	}
}

// Both steps are safe to retry: a replayed give or take applies once, and
// the taker's token is the one minted.
func TestMutexHandoffRetried(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	a, b := c.NewMutex("job"), c.NewMutex("job")
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := handoffScript.Load(ctx, rdb).Err(); err != nil { // so that EVALSHA runs, and is replayed
		t.Fatal(err)
	}
	cnt.armReplay(handoffScript)
	handle, err := a.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cnt.armReplay(handoffScript)
	if err := b.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	key := "redisync:lock:{job}"
	if v, _ := mr.Get(key + ":token"); mr.HGet(key, b.holdID()) != "1" || v != strconv.FormatInt(b.Token(), 10) {
		t.Fatalf("after replays: count %q, counter %q, token %d", mr.HGet(key, b.holdID()), v, b.Token())
	}
}
