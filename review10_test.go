package redisync

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// hookObserver is an Observer that runs onEnd (when set) at the end of
// each call, in the caller's goroutine.
type hookObserver struct {
	onEnd func(Call)
}

func (o *hookObserver) CallStart(ctx context.Context, _ Call) context.Context { return ctx }
func (o *hookObserver) CallEnd(_ context.Context, c Call) {
	if o.onEnd != nil {
		o.onEnd(c)
	}
}
func (o *hookObserver) Event(Event) {}

// lockFields returns the fields of a lock's hash but the layout mark and
// the metadata.
func lockFields(t *testing.T, mr interface {
	HKeys(string) ([]string, error)
}, key string) []string {
	t.Helper()
	f, _ := mr.HKeys(key)
	return slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "{") })
}

// Review 10, finding 1. A waiter with metadata writes its record as
// "deadline:handoff:metadata". Every earlier version (layout 1 and layout 2
// before WithMetadata) parses a waiter record with '^(%d+):(%d+)$': its
// release takes that live waiter for a dead one, drops it, and hands the
// lock to the waiter behind it. docs/upgrading.md: "A fair queue may hold
// waiters of both versions: an older version's release then hands the lock
// to a waiter of this version"; and within layout 2, "versions mix
// freely". (The pre-metadata layout-2 release, 8f61dc3^, has the same
// parse_waiter as testdata/layout1.)
func TestReview10OlderReleaseDropsWaiterWithMetadata(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")

	cn := newClient(t, rdb, WithLabel("new-holder"))
	n := cn.NewMutex("job")
	if err := n.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// An old-version fair waiter, first in the queue.
	old := "old-version/abc-1"
	mr.ZAdd(k.Queue, 1, old)
	mr.HSet(k.Waiters, old, strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)+":5000")
	mr.SetTTL(k.Queue, time.Minute)
	mr.SetTTL(k.Waiters, time.Minute)

	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Second: a new-version waiter with metadata; third: one without.
	c1 := newClient(t, rdb, WithLabel("meta-waiter"))
	m1 := c1.NewMutex("job", WithMetadata("job 7"))
	done1 := make(chan error, 1)
	go func() { done1 <- m1.Lock(lctx) }()
	eventually(t, 5*time.Second, "the waiter with metadata to queue", func() bool {
		m, _ := mr.ZMembers(k.Queue)
		return len(m) == 2
	})
	c2 := newClient(t, rdb, WithLabel("plain-waiter"))
	m2 := c2.NewMutex("job")
	done2 := make(chan error, 1)
	go func() { done2 <- m2.Lock(lctx) }()
	eventually(t, 5*time.Second, "the plain waiter to queue", func() bool {
		m, _ := mr.ZMembers(k.Queue)
		return len(m) == 3
	})

	// The new holder releases: the old waiter gets the lock.
	if err := n.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := lockFields(t, mr, k.Hash); len(ids) != 1 || ids[0] != old {
		t.Fatalf("holder %q, want the old waiter", ids)
	}
	// The old version releases with its own script: the lock must go to
	// the next in line, the waiter with metadata.
	tok, _ := strconv.ParseInt(mustGet(t, mr, k.Token), 10, 64)
	if res, err := layout1Script(t, "release.lua").Run(ctx, rdb,
		[]string{k.Hash, k.Token, k.Queue, k.Waiters, k.Tombstone(old), k.Hash + ":withdrawn"}, // layout 1's keys
		old, tok, 10000, k.Channel, "PUBLISH", "release").Int64(); err != nil || res != 1 {
		t.Fatalf("the old version's release: %v, %v", res, err)
	}
	if ids := lockFields(t, mr, k.Hash); len(ids) != 1 || !strings.HasPrefix(ids[0], "meta-waiter/") {
		t.Errorf("after the old version's release the lock went to %q; want the waiter with metadata, next in line", ids)
	}

	cancel()
	for _, x := range []struct {
		m    *Mutex
		done chan error
	}{{m1, done1}, {m2, done2}} {
		if err := <-x.done; err == nil {
			_ = x.m.Unlock(ctx)
		}
	}
}

// Review 10, finding 2. Do runs fn under, and then unlocks, the value's
// hold as it finds it after Lock returned, not the hold its Lock took. If
// that hold is lost and another goroutine of the value takes the lock anew
// in between (Lock takes a lost hold's lock anew), Do unlocks the other
// goroutine's hold, and reports success for work done without its own
// hold. hold.go's do promises: "When the value's hold is not the one
// acquire took any more (it was lost, and another goroutine of the value
// took the lock anew ...), it is not released". The window is made
// deterministic by an Observer's CallEnd, which runs in Do's goroutine
// after its Lock took the hold.
func TestReview10RedMutexDoUnlocksAnotherGoroutinesHold(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	obs := &hookObserver{}
	r := newRedlock(t, rdbs, WithObserver(obs), WithWatchdogLease(600*time.Millisecond), WithNodeTimeout(200*time.Millisecond))
	m := r.NewMutex("l")
	key := "redisync:lock:{l}"

	var fired atomic.Bool
	var other int64 // the token of the hold the other goroutine took
	obs.onEnd = func(c Call) {
		if c.Op != OpLock || c.Err != nil || !fired.CompareAndSwap(false, true) {
			return
		}
		// Do's Lock took a hold; it is lost (a quorum of node holds
		// gone) ...
		lost := m.Lost()
		mrs[0].Del(key)
		mrs[1].Del(key)
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Error("the hold was not lost")
			return
		}
		// ... and another goroutine of the value takes the lock anew.
		errc := make(chan error, 1)
		go func() { errc <- m.Lock(ctx) }()
		if err := <-errc; err != nil {
			t.Errorf("the other goroutine's Lock: %v", err)
			return
		}
		other = m.Token()
	}

	ranUnder := int64(0)
	err := m.Do(ctx, func(context.Context) error {
		ranUnder = m.Token()
		return nil
	})
	if !fired.Load() || other == 0 {
		t.Fatal("the other goroutine took no hold")
	}
	if !errors.Is(err, ErrLockLost) {
		t.Errorf("Do whose hold was lost before fn ran: %v, want ErrLockLost", err)
	}
	if ranUnder == other {
		t.Errorf("fn ran under the other goroutine's hold (token %d)", other)
	}
	if m.Lost() == nil || m.Token() != other {
		t.Errorf("Do unlocked the hold another goroutine took (token %d); m now holds token %d", other, m.Token())
	}
	// The other goroutine's hold is on the nodes its round took: a
	// quorum, not every node (node 2's old hold may still have been on
	// its way out then: see RedMutex.idle).
	m.mu.Lock()
	member := slices.Clone(m.member)
	m.mu.Unlock()
	n := 0
	for i, mr := range mrs {
		if !member[i] {
			continue
		}
		n++
		if !mr.Exists(key) {
			t.Errorf("node %d: the other goroutine's node hold was released", i)
		}
	}
	if n < 2 {
		t.Errorf("the other goroutine holds %d nodes, want a quorum", n)
	}
	_ = m.Unlock(ctx)
}

// Review 10, finding 2, on a Mutex (the same do in hold.go).
func TestReview10MutexDoUnlocksAnotherGoroutinesHold(t *testing.T) {
	mr, rdb, _ := newMini(t)
	obs := &hookObserver{}
	c := newClient(t, rdb, WithObserver(obs))
	m := c.NewMutex("job")

	var fired atomic.Bool
	var other int64
	obs.onEnd = func(call Call) {
		if call.Op != OpLock || call.Err != nil || !fired.CompareAndSwap(false, true) {
			return
		}
		mr.Del("redisync:lock:{job}")
		if _, err := m.TTL(ctx); !errors.Is(err, ErrLockLost) { // finds it gone: lost
			t.Errorf("TTL of a deleted hold: %v", err)
		}
		errc := make(chan error, 1)
		go func() { errc <- m.Lock(ctx) }()
		if err := <-errc; err != nil {
			t.Errorf("the other goroutine's Lock: %v", err)
			return
		}
		other = m.Token()
	}
	err := m.Do(ctx, func(context.Context) error { return nil })
	if !fired.Load() || other == 0 {
		t.Fatal("the other goroutine took no hold")
	}
	if !errors.Is(err, ErrLockLost) {
		t.Errorf("Do whose hold was lost before fn ran: %v, want ErrLockLost", err)
	}
	if m.Lost() == nil || m.Token() != other || !mr.Exists("redisync:lock:{job}") {
		t.Errorf("Do unlocked the hold another goroutine took (token %d); m now holds token %d", other, m.Token())
	}
	_ = m.Unlock(ctx)
}
