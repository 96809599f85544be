package watchdog

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeRenew answers renewals from held: 1 while an owner is in it, 0 once
// it is not. gate, when not nil, holds every call until it is closed.
type fakeRenew struct {
	mu    sync.Mutex
	held  map[string]bool
	calls atomic.Int32
	gate  chan struct{}
}

func (f *fakeRenew) renew(ctx context.Context, batch []Renewal) ([]int64, error) {
	f.calls.Add(1)
	f.mu.Lock()
	gate := f.gate
	res := make([]int64, 0, len(batch)+1)
	for _, r := range batch {
		if f.held[r.Owner] {
			res = append(res, 1)
		} else {
			res = append(res, 0)
		}
	}
	f.mu.Unlock()
	if gate != nil {
		<-gate // ran in Redis; its reply is late
	}
	return append(res, time.Now().UnixMilli()), nil
}

func (f *fakeRenew) set(owner string, held bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[owner] = held
}

// holdEntry adds a renewed hold of owner with a lease of a minute: its
// next renewal is 20 s away.
func holdEntry(t *testing.T, w *Watchdog, owner string) (*Entry, <-chan struct{}) {
	t.Helper()
	gone := make(chan struct{})
	e := &Entry{Kind: "hold", Owner: owner, Keys: []string{"lock:" + owner, "queue"}, TTL: time.Minute, Hold: true, Renew: true,
		Gone: func() { close(gone) }}
	if !w.Add(e, time.Now(), time.Minute) {
		t.Fatal("Add refused")
	}
	return e, gone
}

func lostWithin(t *testing.T, gone <-chan struct{}, d time.Duration) {
	t.Helper()
	select {
	case <-gone:
		return
	default:
	}
	select {
	case <-gone:
	case <-time.After(d):
		t.Fatalf("not reported lost within %v", d)
	}
}

func stillHeld(t *testing.T, gone <-chan struct{}) {
	t.Helper()
	select {
	case <-gone:
		t.Fatal("a hold still held was reported lost")
	default:
	}
}

// RenewNow renews at once, and the reply decides: a hold gone is lost, a
// hold still held is kept.
func TestRenewNow(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeRenew{held: map[string]bool{"a": true, "b": true}}
	w := New(ctx, Config{Renew: f.renew})
	defer w.Wait()
	defer cancel()
	_, goneA := holdEntry(t, w, "a")
	_, goneB := holdEntry(t, w, "b")
	f.set("a", false)
	w.RenewNow()
	lostWithin(t, goneA, time.Second)
	stillHeld(t, goneB)
}

// A RenewNow that comes while a renewal is out has another renewal sent
// as soon as it answers: the one out may have run before the lease ended.
func TestRenewNowWhileARenewalIsOut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeRenew{held: map[string]bool{"a": true}}
	w := New(ctx, Config{Renew: f.renew})
	defer w.Wait()
	defer cancel()
	_, gone := holdEntry(t, w, "a")
	gate := make(chan struct{})
	f.mu.Lock()
	f.gate = gate
	f.mu.Unlock()
	w.RenewNow() // runs while held; its reply waits at the gate
	for f.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	f.mu.Lock()
	f.gate = nil
	f.held["a"] = false // the lease ends in Redis
	f.mu.Unlock()
	w.RenewNow() // busy: marked for another renewal
	close(gate)
	lostWithin(t, gone, time.Second)
	if n := f.calls.Load(); n != 2 {
		t.Errorf("%d renewals, want 2", n)
	}
}

// Lose reports lost the one hold named, and no other; DropHolds every
// hold, and returns the locks' keys and owners.
func TestLoseAndDropHolds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeRenew{held: map[string]bool{"a": true, "b": true, "c": true}}
	w := New(ctx, Config{Renew: f.renew})
	defer w.Wait()
	defer cancel()
	_, goneA := holdEntry(t, w, "a")
	_, goneB := holdEntry(t, w, "b")
	_, goneC := holdEntry(t, w, "c")
	if w.Lose("hold", "lock:a", "b") || w.Lose("sem", "lock:a", "a") {
		t.Fatal("Lose of a hold that is not there reported one")
	}
	if !w.Lose("hold", "lock:a", "a") {
		t.Fatal("Lose found no hold")
	}
	lostWithin(t, goneA, 0)
	stillHeld(t, goneB)
	keys, owners := w.DropHolds("hold")
	slices.Sort(keys)
	slices.Sort(owners)
	if !slices.Equal(keys, []string{"lock:b", "lock:c"}) || !slices.Equal(owners, []string{"b", "c"}) {
		t.Fatalf("DropHolds = %v, %v", keys, owners)
	}
	lostWithin(t, goneB, 0)
	lostWithin(t, goneC, 0)
	if f.calls.Load() != 0 {
		t.Errorf("%d renewals sent, want none", f.calls.Load())
	}
}
