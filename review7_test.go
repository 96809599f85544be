package redisync

import (
	"context"
	"errors"
	"runtime"
	"testing"
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
