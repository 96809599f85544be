package redisync

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Issue 17, point 4: a hold's context ends the moment the hold does, and
// its cause tells a loss from a release.
func TestMutexHoldContext(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWatchdogLease(150*time.Millisecond))
	m := c.NewMutex("job")

	hctx, cancel := m.HoldContext(ctx)
	if !errors.Is(context.Cause(hctx), ErrNotHeld) {
		t.Fatalf("holding nothing: cause %v, want ErrNotHeld", context.Cause(hctx))
	}
	cancel()

	// Released: cause ErrReleased, after the last level only.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel = m.HoldContext(ctx)
	defer cancel()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if hctx.Err() != nil {
		t.Fatal("the hold's context ended with a level still held")
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	<-hctx.Done()
	if !errors.Is(context.Cause(hctx), ErrReleased) {
		t.Fatalf("released: cause %v, want ErrReleased", context.Cause(hctx))
	}

	// Lost: cause ErrLockLost, by the time Lost closes.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := m.HoldContext(ctx)
	defer lcancel()
	mr.Del("redisync:lock:{job}")
	<-m.Lost()
	select {
	case <-lctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the hold's context did not end with the loss")
	}
	if !errors.Is(context.Cause(lctx), ErrLockLost) {
		t.Fatalf("lost: cause %v, want ErrLockLost", context.Cause(lctx))
	}

	// The parent's end ends it too.
	if err := m.Lock(ctx); err != nil { // takes the lock anew (point 7)
		t.Fatal(err)
	}
	parent, stop := context.WithCancel(ctx)
	pctx, pcancel := m.HoldContext(parent)
	defer pcancel()
	stop()
	<-pctx.Done()
	if !errors.Is(context.Cause(pctx), context.Canceled) {
		t.Fatalf("parent cancelled: cause %v", context.Cause(pctx))
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMutexDo(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWatchdogLease(150*time.Millisecond))
	m := c.NewMutex("job")
	boom := errors.New("boom")
	err := m.Do(ctx, func(ctx context.Context) error {
		if !mr.Exists("redisync:lock:{job}") || ctx.Err() != nil {
			t.Error("fn runs without the lock")
		}
		return boom
	})
	if !errors.Is(err, boom) || mr.Exists("redisync:lock:{job}") {
		t.Fatalf("Do: %v, lock left %v; want fn's error and the lock released", err, mr.Exists("redisync:lock:{job}"))
	}
	// Lost while fn runs: fn's context ends with ErrLockLost, and so does Do.
	err = m.Do(ctx, func(ctx context.Context) error {
		mr.Del("redisync:lock:{job}")
		<-ctx.Done()
		return context.Cause(ctx)
	})
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("Do with the hold lost: %v, want ErrLockLost", err)
	}
	// Lock fails: fn does not run.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	ran := false
	if err := m.Do(cancelled, func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("Do with an ended ctx: %v, ran %v", err, ran)
	}
}

func TestSemaphoreDo(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	s := c.NewSemaphore("s", 3)
	err := s.Do(ctx, 2, func(ctx context.Context) error {
		if s.Held() != 2 || permitsOf(mr, s) != "2" || ctx.Err() != nil {
			t.Errorf("fn runs holding %d, Redis counts %s", s.Held(), permitsOf(mr, s))
		}
		return nil
	})
	if err != nil || s.Held() != 0 {
		t.Fatalf("Do: %v, holding %d after", err, s.Held())
	}
	hctx, cancel := s.HoldContext(ctx)
	defer cancel()
	if !errors.Is(context.Cause(hctx), ErrNotHeld) {
		t.Fatalf("holding nothing: cause %v", context.Cause(hctx))
	}
}

// Issue 17, point 4, for the RedMutex too: its HoldContext ends with the
// hold (ErrReleased, ErrLockLost) and Do unlocks, or reports the loss.
func TestRedMutexHoldContextAndDo(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	r := newRedlock(t, rdbs, WithWatchdogLease(600*time.Millisecond), WithNodeTimeout(200*time.Millisecond))
	m := r.NewMutex("l")
	if hctx, cancel := m.HoldContext(ctx); !errors.Is(context.Cause(hctx), ErrNotHeld) {
		t.Errorf("without a hold: cause %v, want ErrNotHeld", context.Cause(hctx))
	} else {
		cancel()
	}

	lockOnAll(t, m)
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(hctx), ErrReleased) {
		t.Errorf("after Unlock: cause %v, want ErrReleased", context.Cause(hctx))
	}

	// Do: fn runs under the hold's context, and the lock is released.
	ran := false
	if err := m.Do(ctx, func(c context.Context) error {
		ran = c.Err() == nil && m.Token() > 0
		return nil
	}); err != nil || !ran {
		t.Fatalf("Do: %v, ran under the hold %v", err, ran)
	}
	if m.Lost() != nil {
		t.Error("Do left the lock held")
	}

	// Lost while fn runs: fn's context ends with ErrLockLost, and Do
	// says so.
	err := m.Do(ctx, func(c context.Context) error {
		mrs[0].Del("redisync:lock:{l}")
		mrs[1].Del("redisync:lock:{l}")
		select {
		case <-c.Done():
			return context.Cause(c)
		case <-time.After(5 * time.Second):
			return errors.New("the hold's context did not end")
		}
	})
	if !errors.Is(err, ErrLockLost) || strings.Contains(err.Error(), "did not end") {
		t.Errorf("Do with the hold lost: %v, want ErrLockLost", err)
	}
}
