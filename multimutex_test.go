package redisync

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

func TestMultiMutexBadInputIsRefusedByItsConstructor(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	cases := []struct {
		name string
		err  error // NewMultiMutex's
		want error
	}{
		{"no names", errOf(c.NewMultiMutex(nil)), ErrNoNames},
		{"duplicate", errOf(c.NewMultiMutex([]string{"a", "b", "a"})), ErrDuplicateName},
		{"empty name", errOf(c.NewMultiMutex([]string{"a", ""})), ErrInvalidName},
		{"name without a hash tag", errOf(c.NewMultiMutex([]string{"}a"})), ErrInvalidName},
		{"bad option", errOf(c.NewMultiMutex([]string{"a", "b"}, WithFixedLease(0))), ErrInvalidOption},
		{"more than MaxMultiNames", errOf(c.NewMultiMutex(manyNames("n", MaxMultiNames+1))), ErrTooManyNames},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkInvalid(t, tc.err, tc.want) })
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands reached Redis, want 0", n)
	}
}

func TestMultiMutexOrderIsGlobal(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	a := must(c.NewMultiMutex([]string{"x", "acct:1", "acct:2"})).Names()
	b := must(c.NewMultiMutex([]string{"acct:2", "x", "acct:1"})).Names()
	if !slices.Equal(a, b) {
		t.Fatalf("orders differ: %q and %q", a, b)
	}
	slot := func(n string) uint16 { return schema.Slot(schema.LockKeys(schema.DefaultPrefix, n).Hash) }
	for i := 1; i < len(a); i++ {
		if s, p := slot(a[i]), slot(a[i-1]); s < p || s == p && a[i] < a[i-1] {
			t.Fatalf("%q is not ordered by slot, then name", a)
		}
	}
}

// TestMultiMutexOneCall checks which name sets are taken in one script
// call: any on one Redis; on a Cluster, or a user's type that embeds a
// ClusterClient, only names that share a slot.
func TestMultiMutexOneCall(t *testing.T) {
	type wrapper struct{ *redis.ClusterClient }
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _, _ = cluster.Close(), single.Close() })
	keys := func(names ...string) []schema.Lock {
		var ks []schema.Lock
		for _, n := range names {
			ks = append(ks, schema.LockKeys(schema.DefaultPrefix, n))
		}
		return ks
	}
	for _, tc := range []struct {
		rdb   redis.UniversalClient
		names []string
		want  bool
	}{
		{single, []string{"a", "b"}, true},
		{cluster, []string{"a", "b"}, false},
		{cluster, []string{"{acct}1", "{acct}2"}, true},
		{cluster, []string{"a"}, true},
		{wrapper{cluster}, []string{"a", "b"}, false},
		{wrapper{cluster}, []string{"{acct}1", "{acct}2"}, true},
	} {
		if got := oneCall(newClient(t, tc.rdb), keys(tc.names...)); got != tc.want {
			t.Errorf("%T %q: oneCall %v, want %v", tc.rdb, tc.names, got, tc.want)
		}
	}
}

// TestMultiMutexFastPath checks that free names sharing a slot are taken
// in one script call, with a token each, and released all.
func TestMultiMutexFastPath(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMultiMutex([]string{"b", "a", "c"}))
	// Load the script first: the first run of a script is EVALSHA, then
	// EVAL.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	before := cnt.n.Load()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cnt.n.Load() - before; n != 1 {
		t.Errorf("Lock of three free names sent %d commands, want 1", n)
	}
	tokens := m.Tokens()
	for _, name := range []string{"a", "b", "c"} {
		k := schema.LockKeys(schema.DefaultPrefix, name)
		if ids := holdIDs(t, mr, k.Hash); len(ids) != 1 {
			t.Errorf("%s holds %q, want one hold", name, ids)
		}
		if tokens[name] == 0 || m.TokenOf(name) != tokens[name] {
			t.Errorf("%s: token %d, Token %d", name, tokens[name], m.TokenOf(name))
		}
	}
	// A Mutex of one of the names is excluded, and excludes in turn.
	other := must(c.NewMutex("b"))
	if ok, err := other.TryLock(ctx); ok || err != nil {
		t.Fatalf("a Mutex took a name of the held set: %v, %v", ok, err)
	}
	before = cnt.n.Load()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cnt.n.Load() - before; n != 1 {
		t.Errorf("Unlock of three names sent %d commands, want 1", n)
	}
	if m.Tokens() != nil || m.Lost() != notHeld {
		t.Error("after Unlock: Tokens not nil, or Lost not the closed channel of no hold")
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Unlock: %v, want ErrNotHeld", err)
	}
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		t.Fatalf("the released name was not free: %v, %v", ok, err)
	}
	if ok, err := m.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock took a set with a name held: %v, %v", ok, err)
	}
	for _, name := range []string{"a", "c"} {
		if lockHeldAt(t, mr, schema.LockKeys(schema.DefaultPrefix, name), time.Now()) {
			t.Errorf("TryLock that failed left %s held", name)
		}
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMultiMutexReentrantAndDo checks levels, HoldContext and Do.
func TestMultiMutexReentrantAndDo(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMultiMutex([]string{"a", "b"}))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	if err := m.Lock(hctx); err != nil { // re-entered
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if hctx.Err() != nil || m.Tokens() == nil {
		t.Fatal("the first of two Unlocks ended the hold")
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(hctx), ErrReleased) {
		t.Fatalf("hold context cause %v, want ErrReleased", context.Cause(hctx))
	}
	ran := false
	if err := m.Do(ctx, func(ctx context.Context) error {
		ran = m.Tokens() != nil && ctx.Err() == nil
		return nil
	}); err != nil || !ran {
		t.Fatalf("Do: %v, ran %v", err, ran)
	}
	if m.Lost() != notHeld {
		t.Fatal("Do left the set held")
	}
}

// TestMultiMutexReleaseOfOneNameFails breaks one name's queue while the
// set is held, which fails the one-call release on that name (its
// hand-off): Unlock reports it, and still releases the other names.
func TestMultiMutexReleaseOfOneNameFails(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMultiMutex([]string{"a", "b", "c"}))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// The hand-off reads the queue only when someone waits: queue a
	// waiter on b, then make b's queue a hash.
	w := must(c.NewMutex("b"))
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Lock(wctx) }()
	kb := schema.LockKeys(schema.DefaultPrefix, "b")
	eventually(t, 5*time.Second, "a waiter on b", func() bool { return len(queuedTickets(t, mr, kb)) == 1 })
	mr.Del(kb.Queue)
	mr.HSet(kb.Queue, "x", "y")
	err := m.Unlock(ctx)
	if !errors.Is(err, ErrWrongType) {
		t.Errorf("Unlock: %v, want ErrWrongType", err)
	}
	for _, name := range []string{"a", "c"} {
		if lockHeldAt(t, mr, schema.LockKeys(schema.DefaultPrefix, name), time.Now()) {
			t.Errorf("%s still held after Unlock", name)
		}
	}
	cancel()
	<-done
	mr.Del(kb.Queue)
	mr.Del(kb.Hash)
}

// TestMultiMutexTryLockDuringLock checks that a Lock whose ctx ends while
// it waits, holding the first name, leaves nothing behind; that TryLock
// does not wait for a Lock of the same value under way; and that once the
// set is held, TryLock is false but with the hold's context, which
// re-enters it.
func TestMultiMutexTryLockDuringLock(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMultiMutex([]string{"a", "b"}))
	// The second name in the order is held: a Lock takes the first, then
	// waits for it.
	second := m.Names()[1]
	other := must(c.NewMutex(second))
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	kb := schema.LockKeys(schema.DefaultPrefix, second)
	queued := func() bool { return len(queuedTickets(t, mr, kb)) == 1 }

	// A Lock that gives up while it waits for b holds nothing after.
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Lock(lctx) }()
	eventually(t, 5*time.Second, "the Lock to queue for the second name", queued)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock: %v, want context.Canceled", err)
	}
	for _, k := range []schema.Lock{schema.LockKeys(schema.DefaultPrefix, m.Names()[0]), kb} {
		if k != kb && lockHeldAt(t, mr, k, time.Now()) || k == kb && len(holdIDs(t, mr, k.Hash)) != 1 {
			t.Errorf("%s: the Lock that gave up left a hold", k.Hash)
		}
		if ms := queuedTickets(t, mr, k); len(ms) != 0 {
			t.Errorf("%s queues %q after the Lock gave up", k.Queue, ms)
		}
	}

	go func() { done <- m.Lock(ctx) }()
	eventually(t, 5*time.Second, "the Lock to queue for the second name", queued)
	if ok, err := m.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock during a Lock: %v, %v, want false, nil", ok, err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ok, err := m.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock of a set another call holds: %v, %v, want false", ok, err)
	}
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	if ok, err := m.TryLock(hctx); !ok || err != nil {
		t.Fatalf("TryLock with the hold's context: %v, %v, want true (re-entered)", ok, err)
	}
	for range 2 {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMultiMutexObserved checks that a MultiMutex's calls are told as one
// call each (not one per name), and the holds of its names as a Mutex's,
// one per name.
func TestMultiMutexObserved(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &recorder{}
	c := newClient(t, rdb, WithObserver(rec))
	for _, fast := range []bool{true, false} {
		m := must(c.NewMultiMutex([]string{"a", "b"}))
		m.fast = fast
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Close()
	rec.mu.Lock()
	for _, call := range rec.calls {
		if call.Primitive != PrimitiveMultiMutex || call.Name != "b+a" && call.Name != "a+b" {
			t.Errorf("call told: %+v", call)
		}
	}
	rec.mu.Unlock()
	if got := rec.outcomes(OpLock); got[OutcomeAcquired] != 2 || len(got) != 1 {
		t.Errorf("Lock outcomes %v", got)
	}
	if got := rec.outcomes(OpUnlock); got[OutcomeReleased] != 2 || len(got) != 1 {
		t.Errorf("Unlock outcomes %v", got)
	}
	taken, released := rec.kinds(EventHoldTaken), rec.kinds(EventHoldReleased)
	if len(taken) != 4 || len(released) != 4 || taken[0].Primitive != PrimitiveMutex {
		t.Errorf("holds told: taken %+v, released %+v", taken, released)
	}
}

// TestMultiMutexRetriedTake replays the one-call take, as go-redis does
// after a lost reply: the second run finds the ticket holding every name
// and reports the same tokens, and nothing more is sent.
func TestMultiMutexRetriedTake(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMultiMutex([]string{"a", "b"}))
	if err := m.Lock(ctx); err != nil { // loads the script
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	cnt.armReplay(multiAcquireScript)
	before := cnt.n.Load()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cnt.n.Load() - before; n != 2 {
		t.Errorf("a replayed take sent %d commands, want 2 (the take and its copy)", n)
	}
	for name, tok := range m.Tokens() {
		k := schema.LockKeys(schema.DefaultPrefix, name)
		if stored := lockStateOf(t, mr, k).Token; stored != tok {
			t.Errorf("%s: token %d, the lock's last token %d", name, tok, stored)
		}
		if ids := holdIDs(t, mr, k.Hash); len(ids) != 1 {
			t.Errorf("%s holds %q, want one hold", name, ids)
		}
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
