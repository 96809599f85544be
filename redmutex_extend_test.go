package redisync

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/watchdog"
)

// Extend and TTL of a RedMutex that holds nothing, or with a bad lease,
// fail before any call to a node.
func TestRedMutexExtendErrors(t *testing.T) {
	_, rdbs, cnts := newMiniNodes(t, 3)
	r := newRedlock(t, rdbs)
	m := must(r.NewMutex("e"))
	sent := func() (n int64) {
		for _, c := range cnts {
			n += c.n.Load()
		}
		return n
	}
	if err := m.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend with nothing held: %v, want ErrNotHeld", err)
	}
	if d, err := m.TTL(ctx); d != 0 || !errors.Is(err, ErrNotHeld) {
		t.Errorf("TTL with nothing held: %v, %v, want 0, ErrNotHeld", d, err)
	}
	if n := sent(); n != 0 {
		t.Fatalf("%d commands reached the nodes, want 0", n)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Unlock(ctx) }()
	before := sent()
	for _, lease := range []time.Duration{0, MaxLease + time.Millisecond} {
		if err := m.Extend(ctx, lease); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("Extend(%v): %v, want ErrInvalidOption", lease, err)
		}
	}
	if n := sent() - before; n != 0 {
		t.Fatalf("refused Extends sent %d commands, want 0", n)
	}
}

// Extend succeeds while a quorum of nodes extends, and fails with
// ErrQuorum once a majority is down; TTL is the quorum-th largest lease
// left, less the call's time and the drift margin.
func TestRedMutexExtendQuorum(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	at := freeze(mrs[0])
	for _, mr := range mrs[1:] {
		mr.SetTime(at)
	}
	r := newRedlock(t, rdbs, WithNodeTimeout(5*time.Second)) // every node answers in time, on a loaded machine too
	m := must(r.NewMutex("ext", WithFixedLease(time.Minute)))
	key := "redisync:lock:{ext}"
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, 2*time.Minute); err != nil {
		t.Fatalf("Extend with every node up: %v", err)
	}
	// Extend returns once a quorum extended: a node slower than that (a
	// loaded machine) extends a little later, or not at all (its call ran
	// past the node timeout), and must have settled before the leases are
	// set below, or its extension would overwrite one. Six seconds on,
	// past the node timeout, no extension is on its way.
	settled := time.Now().Add(6 * time.Second)
	for i := 0; i < len(mrs); {
		switch {
		case leaseIn(t, mrs[i], key, at) == 2*time.Minute:
			i++
		case time.Now().After(settled):
			t.Logf("node %d did not extend (lease %v): a Redlock extends on a quorum", i, leaseIn(t, mrs[i], key, at))
			i++
		default:
			time.Sleep(time.Millisecond)
		}
	}

	// The quorum-th largest lease left: 6s of 3s, 10s and 6s. TTL gives
	// the nodes slower than a quorum a grace only (minGrace): when one of
	// them answers after it, the quorum-th largest of those that answered
	// in time is 3s, a lower bound, which a loaded machine may see; the
	// test asks again then.
	for i, left := range []time.Duration{3 * time.Second, 10 * time.Second, 6 * time.Second} {
		mrs[i].HSet(key, schema.EndField, strconv.FormatInt(at.Add(left).UnixMilli(), 10))
	}
	want, bound := 6*time.Second-watchdog.Drift(6*time.Second), 3*time.Second-watchdog.Drift(3*time.Second)
	for try := 1; ; try++ {
		before := time.Now()
		d, err := m.TTL(ctx)
		took := time.Since(before)
		if err == nil && d <= bound && d >= bound-took && try < 5 {
			t.Logf("TTL %v: a node answered after the grace; again", d)
			continue
		}
		if err != nil || d > want || d < want-took {
			t.Fatalf("TTL: %v, %v, want %v less at most %v", d, err, want, took)
		}
		break
	}

	// A minority down (failing every command): Extend still succeeds, on the quorum left.
	mrs[1].SetError("ERR node down")
	if err := m.Extend(ctx, 3*time.Minute); err != nil {
		t.Fatalf("Extend with 1 of 3 nodes down: %v", err)
	}
	for _, i := range []int{0, 2} {
		if ttl := leaseIn(t, mrs[i], key, at); ttl != 3*time.Minute {
			t.Errorf("node %d: lease %v after Extend(3m)", i, ttl)
		}
	}
	if d, err := m.TTL(ctx); err != nil || d <= 2*time.Minute {
		t.Fatalf("TTL with 1 of 3 nodes down: %v, %v, want about 3m", d, err)
	}

	// A majority down: Extend and TTL fail with ErrQuorum.
	mrs[2].SetError("ERR node down")
	if err := m.Extend(ctx, 4*time.Minute); !errors.Is(err, ErrQuorum) {
		t.Fatalf("Extend with 2 of 3 nodes down: %v, want ErrQuorum", err)
	}
	if d, err := m.TTL(ctx); d != 0 || !errors.Is(err, ErrQuorum) {
		t.Fatalf("TTL with 2 of 3 nodes down: %v, %v, want 0, ErrQuorum", d, err)
	}
}
