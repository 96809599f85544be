package redisync

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Every call's error is an *OpError naming the operation and the name,
// through which errors.Is sees the cause.
func TestOpErrorNamesTheOperationAndTheName(t *testing.T) {
	mr, rdb, _ := newMini(t)
	if err := mr.Set("redisync:lock:{x}", "not a lock"); err != nil {
		t.Fatal(err)
	}
	err := must(newClient(t, rdb).NewMutex("x")).Lock(ctx)
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "lock" || oe.Name != "x" || !errors.Is(err, ErrWrongType) {
		t.Fatalf("Lock: %v (%#v); want an *OpError of lock on x wrapping ErrWrongType", err, oe)
	}
	if oe.Error() != err.Error() || !errors.Is(oe.Err, ErrWrongType) {
		t.Fatalf("OpError %q, cause %v", oe.Error(), oe.Err)
	}
}

// errors.As finds a node's *NodeError inside a Redlock's error, as it
// finds the *NodeErrors, and errors.Is sees the node's cause.
func TestNodeErrorIsFoundByErrorsAs(t *testing.T) {
	err := fmt.Errorf("%w: %w", ErrQuorum, &NodeErrors{Nodes: []NodeError{{Node: 0, Err: ErrClosed}, {Node: 2, Err: context.DeadlineExceeded}}})
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Node != 0 {
		t.Fatalf("errors.As(*NodeError): %v, %+v", err, ne)
	}
	var all *NodeErrors
	if !errors.As(err, &all) || len(all.Nodes) != 2 || all.Nodes[1].Error() != "node 2: context deadline exceeded" {
		t.Fatalf("errors.As(*NodeErrors): %+v", all)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrClosed) || !errors.Is(err, ErrQuorum) {
		t.Fatalf("errors.Is misses a cause of %v", err)
	}
}

// A release that fails (here Redis fails every command) says ErrUnconfirmed: what it
// released runs out within its lease; a call that fails before it
// releases anything does not say so.
func TestUnconfirmedReleaseIsErrUnconfirmed(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMutex("m"))
	s := must(c.NewSemaphore("s", 2))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	mr.SetError("ERR injected")
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	if err := m.Unlock(short()); !errors.Is(err, ErrUnconfirmed) {
		t.Errorf("Unlock with Redis failing: %v, want ErrUnconfirmed", err)
	}
	if err := s.Release(short(), 1); !errors.Is(err, ErrUnconfirmed) {
		t.Errorf("Release with Redis failing: %v, want ErrUnconfirmed", err)
	}
	if err := must(c.NewMutex("n")).Lock(short()); err == nil || errors.Is(err, ErrUnconfirmed) {
		t.Errorf("Lock with Redis failing: %v, want an error that is not ErrUnconfirmed", err)
	}
}

// A call that needs a hold, made when there is none, is ErrNotHeld for
// every primitive, whatever its own words for it (ErrTooManyReleased,
// ErrNotLeader).
func TestNothingHeldIsErrNotHeldEverywhere(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	rw := must(c.NewRWMutex("rw"))
	e := must(c.NewElection("e"))
	s := must(c.NewSemaphore("s", 2))
	for what, err := range map[string]error{
		"Mutex.Unlock":      must(c.NewMutex("m")).Unlock(ctx),
		"Mutex.Extend":      must(c.NewMutex("m")).Extend(ctx, time.Minute),
		"RWMutex.Unlock":    rw.Unlock(ctx),
		"RWMutex.RUnlock":   rw.RUnlock(ctx),
		"MultiMutex.Unlock": must(c.NewMultiMutex([]string{"a", "b"})).Unlock(ctx),
		"Semaphore.Release": s.Release(ctx, 1),
		"Election.Resign":   e.Resign(ctx),
		"Election.Proclaim": e.Proclaim(ctx, "v"),
	} {
		if !errors.Is(err, ErrNotHeld) {
			t.Errorf("%s with nothing held: %v, want ErrNotHeld", what, err)
		}
	}
	if err := e.Resign(ctx); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Resign: %v, want ErrNotLeader too", err)
	}
	if err := s.Release(ctx, 1); !errors.Is(err, ErrTooManyReleased) {
		t.Errorf("Release: %v, want ErrTooManyReleased too", err)
	}
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, 2); !errors.Is(err, ErrTooManyReleased) || errors.Is(err, ErrNotHeld) {
		t.Errorf("Release(2) holding 1: %v, want ErrTooManyReleased, not ErrNotHeld", err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}
