package redisync

import (
	"context"
	"strings"
	"testing"
	"time"
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

	a := must(c.NewMutex("job", WithMetadata("deploy 42: v1.3")))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if h := holder(); h.Metadata != "deploy 42: v1.3" {
		t.Errorf("metadata %q after a direct grant", h.Metadata)
	}

	// A fair waiter's metadata (with ':' in it) waits in its record and
	// goes with the hold handed to it.
	b := must(c.NewMutex("job", WithMetadata("build:7:x")))
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
	plain := must(c.NewMutex("job"))
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

func TestMetadataTooLongIsRefusedByTheConstructor(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	checkInvalid(t, errOf(c.NewMutex("job", WithMetadata(strings.Repeat("x", MaxMetadataLen+1)))), ErrInvalidOption)
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands sent", n)
	}
	if err := must(c.NewMutex("job", WithMetadata(strings.Repeat("x", MaxMetadataLen)))).Lock(ctx); err != nil {
		t.Errorf("metadata of MaxMetadataLen bytes: %v", err)
	}
}
