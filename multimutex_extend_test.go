package redisync

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Extend and TTL of a MultiMutex that holds nothing, or with a bad lease,
// fail before any call to Redis.
func TestMultiMutexExtendErrors(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMultiMutex([]string{"a", "b"}))
	if err := m.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend with nothing held: %v, want ErrNotHeld", err)
	}
	if d, err := m.TTL(ctx); d != 0 || !errors.Is(err, ErrNotHeld) {
		t.Errorf("TTL with nothing held: %v, %v, want 0, ErrNotHeld", d, err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Fatalf("%d commands reached Redis, want 0", n)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Unlock(ctx) }()
	before := cnt.n.Load()
	for _, lease := range []time.Duration{0, time.Microsecond, MaxLease + time.Millisecond} {
		if err := m.Extend(ctx, lease); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("Extend(%v): %v, want ErrInvalidOption", lease, err)
		}
	}
	if n := cnt.n.Load() - before; n != 0 {
		t.Fatalf("refused Extends sent %d commands, want 0", n)
	}
}

// An extended MultiMutex keeps every name past its fixed lease: another
// MultiMutex of the same names cannot take them, and TTL reports the least
// lease left.
func TestMultiMutexExtendKeepsEveryName(t *testing.T) {
	mr, rdb, _ := newMini(t)
	at := freeze(mr)
	c := newClient(t, rdb)
	names := []string{"x", "y", "z"}
	m := must(c.NewMultiMutex(names, WithFixedLease(300*time.Millisecond)))
	other := must(c.NewMultiMutex(names, WithFixedLease(300*time.Millisecond)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	for _, name := range names {
		if ttl := leaseIn(t, mr, "redisync:lock:{"+name+"}", at); ttl != 5*time.Second {
			t.Errorf("%s: lease %v after Extend(5s)", name, ttl)
		}
	}
	// A shorter lease changes nothing.
	if err := m.Extend(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	// Past the fixed lease, by the local clock and by the server's.
	select {
	case <-m.Lost():
		t.Fatal("Lost closed within the extended lease")
	case <-time.After(600 * time.Millisecond):
	}
	mr.SetTime(at.Add(time.Second))
	mr.FastForward(time.Second)
	if ok, err := other.TryLock(ctx); ok || err != nil {
		t.Fatalf("another MultiMutex's TryLock past the fixed lease: %v, %v, want false", ok, err)
	}
	if d, err := m.TTL(ctx); d != 4*time.Second || err != nil {
		t.Fatalf("TTL: %v, %v, want 4s", d, err)
	}
	// The least lease among the names.
	mr.HSet("redisync:lock:{y}", schema.EndField, strconv.FormatInt(at.Add(3*time.Second).UnixMilli(), 10))
	if d, err := m.TTL(ctx); d != 2*time.Second || err != nil {
		t.Fatalf("TTL with one name at 2s: %v, %v, want 2s", d, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Token is the token of the first name in Names() order; TokenOf gives
// each name's.
func TestMultiMutexToken(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	pre := must(c.NewMutex("q"))
	for range 3 { // q's tokens run ahead of p's
		if err := pre.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := pre.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	m := must(c.NewMultiMutex([]string{"q", "p"}))
	if m.Token() != 0 || m.TokenOf("p") != 0 {
		t.Fatal("tokens while nothing is held")
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Unlock(ctx) }()
	first := m.Names()[0]
	tokens := m.Tokens()
	if m.Token() != tokens[first] || m.Token() == 0 {
		t.Errorf("Token %d, want %s's %d (tokens %v)", m.Token(), first, tokens[first], tokens)
	}
	for name, tok := range tokens {
		if m.TokenOf(name) != tok {
			t.Errorf("TokenOf(%s) = %d, want %d", name, m.TokenOf(name), tok)
		}
	}
	if m.TokenOf("nope") != 0 {
		t.Error("TokenOf a name not in the set is not 0")
	}
}

// The Observer is told MultiMutex's and RedMutex's Extend and TTL.
func TestObserverExtendAndTTLOfSets(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &recorder{}
	c := newClient(t, rdb, WithObserver(rec))
	m := must(c.NewMultiMutex([]string{"a", "b"}))
	_ = m.Extend(ctx, time.Second) // not held: an error
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := m.TTL(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	_, rdbs, _ := newMiniNodes(t, 3)
	rrec := &recorder{}
	r := newRedlock(t, rdbs, WithObserver(rrec))
	rm := must(r.NewMutex("red"))
	if err := rm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rm.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := rm.TTL(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = rm.Extend(ctx, time.Second) // not held: an error

	for _, x := range []struct {
		what string
		rec  *recorder
		prim Primitive
	}{{"MultiMutex", rec, PrimitiveMultiMutex}, {"RedMutex", rrec, PrimitiveRedMutex}} {
		if got := x.rec.outcomes(OpExtend); got[OutcomeOK] != 1 || got[OutcomeError] != 1 || len(got) != 2 {
			t.Errorf("%s: Extend outcomes %v", x.what, got)
		}
		if got := x.rec.outcomes(OpTTL); got[OutcomeOK] != 1 || len(got) != 1 {
			t.Errorf("%s: TTL outcomes %v", x.what, got)
		}
		x.rec.mu.Lock()
		for _, call := range x.rec.calls {
			if (call.Op == OpExtend || call.Op == OpTTL) && call.Primitive != x.prim {
				t.Errorf("%s: %s told as of %v", x.what, call.Op, call.Primitive)
			}
		}
		x.rec.mu.Unlock()
	}
}
