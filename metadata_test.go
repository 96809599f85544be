package redisync

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Issue 19, point 8: metadata stored with a hold, as bsm/redislock's, read
// by anyone through InspectLock: on a direct grant, through a fair
// hand-off (carried in the waiter's place) and through Handoff/Accept.
func TestMetadataIsStoredWithTheHold(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	holder := func() *LockHolder {
		t.Helper()
		st, err := c.InspectLock(ctx, "job")
		if err != nil || st.Holder == nil {
			t.Fatalf("inspect: %+v, %v; want a holder", st, err)
		}
		return st.Holder
	}

	a := c.NewMutex("job", WithMetadata("deploy 42: v1.3"))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if h := holder(); h.Metadata != "deploy 42: v1.3" {
		t.Errorf("metadata %q after a direct grant", h.Metadata)
	}

	// A fair waiter's metadata (with ':' in it) waits in its record and
	// goes with the hold handed to it.
	b := c.NewMutex("job", WithMetadata("build:7:x"))
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Lock(lctx) }()
	eventually(t, 5*time.Second, "b to queue", func() bool {
		st, err := c.InspectLock(ctx, "job")
		return err == nil && len(st.Queue) == 1
	})
	if st, _ := c.InspectLock(ctx, "job"); st.Queue[0].Metadata != "build:7:x" {
		t.Errorf("queued waiter's metadata %q", st.Queue[0].Metadata)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h := holder(); h.Metadata != "build:7:x" || h.Token != b.Token() {
		t.Errorf("after the hand-off: %+v", h)
	}

	// Handed to a Mutex without metadata: the giver's goes.
	handle, err := b.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plain := c.NewMutex("job")
	if err := plain.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	if h := holder(); h.Metadata != "" {
		t.Errorf("metadata %q after Accept by a Mutex without any", h.Metadata)
	}
	if handle, err = plain.Handoff(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	if h := holder(); h.Metadata != "deploy 42: v1.3" {
		t.Errorf("metadata %q after Accept by a", h.Metadata)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := c.InspectLock(ctx, "job"); err != nil || st.Held() {
		t.Errorf("after the last Unlock: %+v, %v", st, err)
	}
}

func TestMetadataTooLongIsRefusedBeforeAnyCall(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	m := c.NewMutex("job", WithMetadata(strings.Repeat("x", MaxMetadataLen+1)))
	if err := m.Lock(ctx); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Lock: %v; want ErrInvalidOption", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands sent", n)
	}
	if err := c.NewMutex("job", WithMetadata(strings.Repeat("x", MaxMetadataLen))).Lock(ctx); err != nil {
		t.Errorf("metadata of MaxMetadataLen bytes: %v", err)
	}
}

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
func TestMetadataOlderReleaseDropsWaiterWithMetadata(t *testing.T) {
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
