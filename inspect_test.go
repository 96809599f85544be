package redisync

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestInspectLockFreeHeldAndQueued(t *testing.T) {
	_, rdb, _ := newMini(t)
	hb := 600 * time.Millisecond
	holder := newClient(t, rdb, WithLabel("web-1"), WithWaiterTimeout(hb))
	waitA := newClient(t, rdb, WithLabel("worker-a"), WithWaiterTimeout(hb))
	waitB := newClient(t, rdb, WithLabel("worker-b"), WithWaiterTimeout(hb))

	st, err := holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if st.Held() || st.LastToken != 0 || len(st.Queue) != 0 || st.Name != "job" {
		t.Fatalf("a lock never taken: %+v", st)
	}

	m := holder.NewMutex("job")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := m.HoldContext(ctx)
	defer hcancel()
	if err := m.Lock(hctx); err != nil { // re-entered: Redis counts one hold
		t.Fatal(err)
	}
	st, err = holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	h := st.Holder
	if h == nil || h.Label != "web-1" || !strings.HasPrefix(h.ID, "web-1/") || h.Count != 1 ||
		h.Token != m.Token() || st.LastToken != m.Token() || h.Lease <= 0 || h.Lease > 30*time.Second {
		t.Fatalf("held twice: %+v (token %d)", h, m.Token())
	}

	// Two fair waiters, a before b.
	var wg sync.WaitGroup
	defer wg.Wait()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ma, mb := waitA.NewMutex("job"), waitB.NewMutex("job")
	errs := make(chan error, 2)
	queued := func(n int) func() bool {
		return func() bool {
			st, err := holder.InspectLock(ctx, "job")
			return err == nil && len(st.Queue) == n
		}
	}
	for i, w := range []*Mutex{ma, mb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.Lock(lctx)
		}()
		eventually(t, 5*time.Second, "waiter to queue", queued(i+1))
	}
	st, err = holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Queue) != 2 || st.Queue[0].Label != "worker-a" || st.Queue[1].Label != "worker-b" {
		t.Fatalf("queue %+v", st.Queue)
	}
	for _, w := range st.Queue {
		if !w.Alive || w.Heartbeat <= 0 || w.Heartbeat > hb || w.HandoffLease != hb || w.Waited < 0 || w.Waited > time.Minute {
			t.Errorf("waiter %+v", w)
		}
	}
	if st.Queue[0].Waited < st.Queue[1].Waited {
		t.Errorf("the first waiter waited %v, less than the second's %v", st.Queue[0].Waited, st.Queue[1].Waited)
	}
	// A waiter may queue before its subscription is confirmed (its first
	// attempt is sent at once); it sleeps only once it is.
	eventually(t, 5*time.Second, "two subscribed processes (the waiters' clients)", func() bool {
		st, err := holder.InspectLock(ctx, "job")
		return err == nil && st.Subscribers == 2
	})

	// Released: the lock is handed to a, b stays queued.
	for range 2 {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	st, err = holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if st.Holder == nil || st.Holder.Label != "worker-a" || st.Holder.Token != ma.Token() || st.Holder.Token <= h.Token ||
		len(st.Queue) != 1 || st.Queue[0].Label != "worker-b" {
		t.Fatalf("after the hand-off: holder %+v, queue %+v", st.Holder, st.Queue)
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("b: %v", err)
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestInspectSemaphoreWeightedAndExpired(t *testing.T) {
	mr, rdb, _ := newMini(t)
	a := newClient(t, rdb, WithLabel("a"))
	b := newClient(t, rdb, WithLabel("b"))
	w := newClient(t, rdb, WithLabel("w"))

	st, err := a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Empty() || st.Available() != 0 {
		t.Fatalf("a semaphore never used: %+v", st)
	}

	sa, sb := a.NewSemaphore("gpus", 5), b.NewSemaphore("gpus", 5)
	if err := sa.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := sb.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.NewSemaphore("gpus", 5).Acquire(wctx, 2) }()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool {
		st, err := a.InspectSemaphore(ctx, "gpus")
		return err == nil && len(st.Queue) == 1
	})
	st, err = a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	if st.Size != 5 || st.InUse != 5 || st.Available() != 0 || len(st.Holders) != 2 {
		t.Fatalf("state %+v", st)
	}
	if h := st.Holders[0]; h.Label != "a" || h.Permits != 2 || h.Lease <= 0 {
		t.Errorf("holder a %+v", h)
	}
	if h := st.Holders[1]; h.Label != "b" || h.Permits != 3 || h.Lease <= 0 {
		t.Errorf("holder b %+v", h)
	}
	q := st.Queue[0]
	if q.Label != "w" || q.Permits != 2 || !q.Alive || !strings.HasPrefix(q.ID, q.Holder+"#") || q.GrantLease <= 0 {
		t.Errorf("waiter %+v", q)
	}

	// b's lease ends (its expiry moved into the past, as when its process
	// stopped): its permits count as free, though the record stays until
	// the semaphore's next call reclaims it.
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, err := mr.ZAdd(sb.keys.Expiry, float64(time.Now().Add(-time.Second).UnixMilli()), sb.holdID()); err != nil {
		t.Fatal(err)
	}
	st, err = a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	if st.InUse != 2 || st.Available() != 3 || len(st.Holders) != 2 || st.Holders[1].Lease > 0 {
		t.Fatalf("after b's lease ended: %+v", st)
	}
	if err := sa.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// b's Release finds its permits reclaimed.
	if err := sb.Release(ctx, 3); !errors.Is(err, ErrLockLost) {
		t.Fatalf("b's Release after its lease ended: %v", err)
	}
}

func TestInspectRefusesBadInputAndWrongTypes(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	if _, err := c.InspectLock(ctx, ""); !errors.Is(err, ErrInvalidName) {
		t.Errorf("empty name: %v", err)
	}
	if _, err := c.InspectSemaphore(ctx, "x", WithKeyPrefix("a{b")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("bad prefix: %v", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands sent for bad input", n)
	}
	if err := mr.Set("redisync:lock:{x}", "a string"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.InspectLock(ctx, "x"); !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), `inspect lock "x"`) {
		t.Errorf("a string lock key: %v", err)
	}
	mr.HSet("redisync:lock:{y}", "someone", "not a count")
	if _, err := c.InspectLock(ctx, "y"); !errors.Is(err, ErrWrongType) {
		t.Errorf("a lock hash without a count: %v", err)
	}
	if err := mr.Set("redisync:sem:{z}:size", "five"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.InspectSemaphore(ctx, "z"); !errors.Is(err, ErrWrongType) {
		t.Errorf("a size that is not a number: %v", err)
	}
	_ = c.Close()
	if _, err := c.InspectLock(ctx, "x"); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// Review 8, finding 2. A label may hold '#' (any printable ASCII but space
// and braces); a semaphore waiter id is "holder id#call". InspectSemaphore
// cuts the id at the first '#', the scripts (sem_holder) at the last: the
// waiter's Holder and Label come out wrong.
func TestInspectSemaphoreWaiterWithHashInLabel(t *testing.T) {
	_, rdb, _ := newMini(t)
	a := newClient(t, rdb, WithLabel("a"))
	w := newClient(t, rdb, WithLabel("pool#2"))
	sa := a.NewSemaphore("gpus", 1)
	if err := sa.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	sw := w.NewSemaphore("gpus", 1)
	go func() { done <- sw.Acquire(wctx, 1) }()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool {
		st, err := a.InspectSemaphore(ctx, "gpus")
		return err == nil && len(st.Queue) == 1
	})
	st, err := a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	q := st.Queue[0]
	if want := q.ID[:strings.LastIndexByte(q.ID, '#')]; q.Holder != want || q.Label != "pool#2" {
		t.Errorf("waiter %q: holder %q, label %q; want holder %q, label %q", q.ID, q.Holder, q.Label, want, "pool#2")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := sa.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}
