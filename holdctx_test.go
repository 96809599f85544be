package redisync

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Issue 17, point 4: a hold's context ends the moment the hold does, and
// its cause tells a loss from a release.
func TestMutexHoldContext(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithCrashTimeout(150*time.Millisecond))
	m := must(c.NewMutex("job"))

	hctx, cancel := m.HoldContext(ctx)
	if !errors.Is(context.Cause(hctx), ErrNotHeld) {
		t.Fatalf("holding nothing: cause %v, want ErrNotHeld", context.Cause(hctx))
	}
	cancel()

	// Released: cause ErrReleased, after the last level only.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel = m.HoldContext(ctx)
	defer cancel()
	if err := m.Lock(hctx); err != nil {
		t.Fatal(err)
	}
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
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) { // the lost hold's
		t.Fatalf("Unlock of the lost hold: %v, want ErrLockLost", err)
	}
	if err := m.Lock(ctx); err != nil {
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
	c := newClient(t, rdb, WithCrashTimeout(150*time.Millisecond))
	m := must(c.NewMutex("job"))
	boom := errors.New("boom")
	err := m.Do(ctx, func(ctx context.Context) error {
		if !lockHeld(t, mr, "redisync:lock:{job}") || ctx.Err() != nil {
			t.Error("fn runs without the lock")
		}
		return boom
	})
	if !errors.Is(err, boom) || lockHeld(t, mr, "redisync:lock:{job}") {
		t.Fatalf("Do: %v, lock left %v; want fn's error and the lock released", err, lockHeld(t, mr, "redisync:lock:{job}"))
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
	s := must(c.NewSemaphore("s", 3))
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
	r := newRedlock(t, rdbs, WithCrashTimeout(600*time.Millisecond), WithNodeTimeout(200*time.Millisecond))
	m := must(r.NewMutex("l"))
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
	if m.Lost() != notHeld {
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

// hookObserver is an Observer that runs onEnd (when set) at the end of
// each call, in the caller's goroutine.
type hookObserver struct {
	onEnd func(CallInfo)
}

func (o *hookObserver) CallStart(ctx context.Context, _ CallInfo) context.Context { return ctx }

func (o *hookObserver) CallEnd(_ context.Context, c CallInfo) {
	if o.onEnd != nil {
		o.onEnd(c)
	}
}

func (o *hookObserver) Event(Event) {}

// Do's hold is lost between its Lock and fn (an Observer's CallEnd runs in
// Do's goroutine after its Lock took the hold), and another goroutine of
// the value locks meanwhile: that Lock is granted a quorum, but returns
// only once Do, whose fn runs under the lost hold's cancelled context,
// has given the lost hold back (ErrLockLost), and Do never releases it.
func TestRedMutexDoSparesAnotherGoroutinesHold(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	obs := &hookObserver{}
	r := newRedlock(t, rdbs, WithObserver(obs), WithCrashTimeout(600*time.Millisecond), WithNodeTimeout(200*time.Millisecond))
	m := must(r.NewMutex("l"))
	key := "redisync:lock:{l}"

	var fired atomic.Bool
	other := make(chan error, 1) // the other goroutine's Lock
	obs.onEnd = func(c CallInfo) {
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
		// ... and another goroutine of the value locks.
		go func() { other <- m.Lock(ctx) }()
	}

	var hctxErr error
	err := m.Do(ctx, func(hctx context.Context) error {
		hctxErr = hctx.Err()
		select {
		case err := <-other:
			return fmt.Errorf("the other goroutine's Lock returned (%v) while Do's lost hold was not given back", err)
		case <-time.After(100 * time.Millisecond):
		}
		return nil
	})
	if !fired.Load() {
		t.Fatal("the hook did not run")
	}
	if !errors.Is(err, ErrLockLost) || hctxErr == nil {
		t.Fatalf("Do whose hold was lost before fn ran: %v (fn's context: %v), want ErrLockLost and a cancelled context", err, hctxErr)
	}
	if err := <-other; err != nil {
		t.Fatalf("the other goroutine's Lock: %v", err)
	}
	member := redMembers(m)
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
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRedMutexDoSparesAnotherGoroutinesHold, on a Mutex.
func TestMutexDoSparesAnotherGoroutinesHold(t *testing.T) {
	mr, rdb, _ := newMini(t)
	obs := &hookObserver{}
	c := newClient(t, rdb, WithObserver(obs))
	m := must(c.NewMutex("job"))

	var fired atomic.Bool
	other := make(chan error, 1)
	obs.onEnd = func(call CallInfo) {
		if call.Op != OpLock || call.Err != nil || !fired.CompareAndSwap(false, true) {
			return
		}
		mr.Del("redisync:lock:{job}")
		if _, err := m.TTL(ctx); !errors.Is(err, ErrLockLost) { // finds it gone: lost
			t.Errorf("TTL of a deleted hold: %v", err)
		}
		go func() { other <- m.Lock(ctx) }()
	}
	err := m.Do(ctx, func(context.Context) error {
		select {
		case err := <-other:
			return fmt.Errorf("the other goroutine's Lock returned (%v) while Do's lost hold was not given back", err)
		case <-time.After(100 * time.Millisecond):
		}
		return nil
	})
	if !fired.Load() {
		t.Fatal("the hook did not run")
	}
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("Do whose hold was lost before fn ran: %v, want ErrLockLost", err)
	}
	if err := <-other; err != nil {
		t.Fatalf("the other goroutine's Lock: %v", err)
	}
	if m.Token() == 0 || !lockHeld(t, mr, "redisync:lock:{job}") {
		t.Fatalf("Do released the hold another goroutine took: token %d, key exists %v", m.Token(), lockHeld(t, mr, "redisync:lock:{job}"))
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// HoldContext says the context is cancelled "the moment" the hold ends
// (by the time Lost closes): it is cancelled later, by a goroutine, so a
// holder that sees Lost closed (or a call return ErrLockLost) still finds
// the hold's context live. One P, so that the goroutine cannot run before
// the test looks: what any scheduler may do.
func TestMutexHoldContextLiveAfterLostCloses(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMutex("job"))
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

// Do on a value shared by goroutines: fn's hold is lost, and another
// goroutine of the value calls Lock meanwhile. That Lock waits, holding
// nothing in Redis, until Do gave its lost hold back, and Do's Unlock,
// owed to the lost hold, does not release the new one.
func TestMutexDoSparesAnotherGoroutinesNewHold(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// A renewal finds the lost hold within a third of the crash timeout;
	// the new hold must outlast a loaded machine's pauses until Unlock.
	c := newClient(t, rdb, WithCrashTimeout(600*time.Millisecond))
	m := must(c.NewMutex("job"))
	done := make(chan error, 1)
	err := m.Do(ctx, func(hctx context.Context) error {
		mr.Del("redisync:lock:{job}")
		<-hctx.Done()
		go func() { done <- m.Lock(ctx) }() // another goroutine of the value
		select {
		case err := <-done:
			t.Errorf("the other goroutine's Lock returned (%v) before Do gave the lost hold back", err)
		case <-time.After(50 * time.Millisecond):
		}
		if lockHeld(t, mr, "redisync:lock:{job}") {
			t.Error("the other goroutine's Lock took the lock in Redis while it waits for Do's Unlock")
		}
		return context.Cause(hctx)
	})
	if !errors.Is(err, ErrLockLost) {
		t.Fatalf("Do: %v, want ErrLockLost", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m.Token() == 0 || !lockHeld(t, mr, "redisync:lock:{job}") {
		t.Fatalf("after Do, the other goroutine's Lock (not unlocked yet) holds nothing: token %d, key exists %v", m.Token(), lockHeld(t, mr, "redisync:lock:{job}"))
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("the other goroutine's Unlock: %v", err)
	}
}

// Lost of a value that holds nothing is a closed channel, before its first
// Lock, after a Lock that failed, and after its Unlock: work that selects
// on it stops rather than run unguarded. While the value holds, it is
// open.
func TestLostWithoutAHoldIsClosed(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	_, rdbs, _ := newMiniNodes(t, 3)
	r := newRedlock(t, rdbs)
	type primitive struct {
		lock, unlock func(context.Context) error
		lost         func() <-chan struct{}
	}
	prims := map[string]func(name string) primitive{
		"Mutex": func(name string) primitive {
			m := must(c.NewMutex(name))
			return primitive{m.Lock, m.Unlock, m.Lost}
		},
		"RWMutex": func(name string) primitive {
			m := must(c.NewRWMutex(name))
			return primitive{m.Lock, m.Unlock, m.Lost}
		},
		"Semaphore": func(name string) primitive {
			s := must(c.NewSemaphore(name, 1))
			return primitive{
				func(ctx context.Context) error { return s.Acquire(ctx, 1) },
				func(ctx context.Context) error { return s.Release(ctx, 1) },
				s.Lost}
		},
		"MultiMutex": func(name string) primitive {
			m := must(c.NewMultiMutex([]string{name, name + "-b"}))
			return primitive{m.Lock, m.Unlock, m.Lost}
		},
		"RedMutex": func(name string) primitive {
			m := must(r.NewMutex(name))
			return primitive{m.Lock, m.Unlock, m.Lost}
		},
		"Election": func(name string) primitive {
			e := must(c.NewElection(name))
			return primitive{
				func(ctx context.Context) error { return e.Campaign(ctx, "v") },
				e.Resign, e.Lost}
		},
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	t.Run("RWMutex reads", func(t *testing.T) {
		rw := must(c.NewRWMutex("lost-reads"))
		if err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		if rw.Lost() != notHeld {
			t.Error("holding only a read: Lost is not the closed channel of no write")
		}
		if err := rw.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
	for kind, newPrim := range prims {
		t.Run(kind, func(t *testing.T) {
			p := newPrim("lost-" + kind)
			if !closed(p.lost()) {
				t.Error("before Lock: Lost is not closed")
			}
			// A Lock that fails, the lock being held by another value
			// of the same kind.
			holder := newPrim("lost-" + kind)
			if err := holder.lock(ctx); err != nil {
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			err := p.lock(short)
			cancel()
			if err == nil {
				t.Fatal("Lock of a held lock succeeded")
			}
			if !closed(p.lost()) {
				t.Error("after a failed Lock: Lost is not closed")
			}
			if err := holder.unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := p.lock(ctx); err != nil {
				t.Fatal(err)
			}
			lost := p.lost()
			if closed(lost) {
				t.Error("while held: Lost is closed")
			}
			if err := p.unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if closed(lost) {
				t.Error("Unlock closed the hold's Lost channel")
			}
			if !closed(p.lost()) {
				t.Error("after Unlock: Lost is not closed")
			}
		})
	}
}
