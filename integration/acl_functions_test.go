package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// The least-privileged user (docs/acl.md, aclFunctionsOnly) may call the
// function library but neither load it nor send scripts: it runs no Lua
// of its own. Until the library is loaded, its calls fail saying how to
// load it, and take nothing; once a Client of a user that may has loaded
// it (LoadFunctions), every primitive works as that user, and its EVAL is
// refused.
func TestACLFunctionsOnly(t *testing.T) {
	s := spawnACL(t)
	if err := s.admin.FunctionFlush(ctx).Err(); err != nil { // as a new version finds the server
		t.Fatal(err)
	}
	s.setUser(t, "fcall-only", aclFunctionsOnly)
	cs := s.aclClients(t, "fcall-only", 3)
	name := redistest.Name(t)
	err := must(cs[0].NewMutex(name)).Lock(ctx)
	if err == nil || !strings.Contains(err.Error(), "LoadFunctions") {
		t.Fatalf("Lock before the library is loaded: %v; want an error that says to load it", err)
	}
	if n := s.admin.Exists(ctx, "redisync:lock:{"+name+"}").Val(); n != 0 {
		t.Fatal("a Lock that failed wrote the lock's state")
	}
	admin, err := redisync.New(s.admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	for range 2 { // loading it again changes nothing
		if err := admin.LoadFunctions(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.admin.Do(ctx, "acl", "log", "reset").Err(); err != nil {
		t.Fatal(err)
	}

	increasing(t, contend(t, mutexes(cs, name, 4), 2*time.Millisecond, rounds(10)).tokens)
	increasing(t, contend(t, mutexes(cs, name+"-barging", 4, redisync.Barging()), 2*time.Millisecond, rounds(10)).tokens)

	sem := redistest.Name(t) + "-sem"
	a, b := must(cs[0].NewSemaphore(sem, 1)), must(cs[1].NewSemaphore(sem, 1))
	if err := a.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Acquire(ctx, 1) }()
	if err := a.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}

	rw := must(cs[2].NewRWMutex(name + "-rw"))
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	mm := must(cs[0].NewMultiMutex([]string{name + "-x", name + "-y"}))
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	e := must(cs[1].NewElection(name + "-e"))
	if err := e.Campaign(ctx, "me"); err != nil {
		t.Fatal(err)
	}
	if l, err := e.Leader(ctx); err != nil || l.Value != "me" {
		t.Fatalf("Leader: %+v, %v; want me", l, err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	// Close gives back what a Client holds, and ResizeSemaphore resizes,
	// on the user's client rather than the Client's own connections.
	closing := s.aclClients(t, "fcall-only", 1)[0]
	if err := must(closing.NewMutex(name + "-closed")).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := must(closing.NewSemaphore(sem, 1)).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := closing.Close(); err != nil {
		t.Fatalf("Close of a Client that holds a lock and a permit: %v", err)
	}
	after := must(cs[1].NewMutex(name + "-closed"))
	if ok, err := after.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after Close: %v, %v; want the lock Close gave back", ok, err)
	}
	if err := after.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].ResizeSemaphore(ctx, sem, 1, 2); err != nil {
		t.Fatal(err)
	}
	s.noDenials(t)

	// The user runs no Lua of its own.
	rdb := s.client(t, "fcall-only")
	for _, cmd := range [][]any{{"eval", "return 1", 0}, {"function", "load", "#!lua name=mine\nredis.register_function('mine', function() return 1 end)"}} {
		if err := rdb.Do(context.Background(), cmd...).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Errorf("%v as the least-privileged user: %v; want NOPERM", cmd[0], err)
		}
	}
}
