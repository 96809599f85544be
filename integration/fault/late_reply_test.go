package fault

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// When replies are delayed past the lease, Lock must not
// return a hold that had already expired in Redis (another client may hold
// the lock by then).
func TestDelayedReplyNeverReturnsExpiredHold(t *testing.T) {
	const lease, delay = 200 * time.Millisecond, 300 * time.Millisecond
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	const trials = 4
	violations := 0
	for i := range trials {
		px := redistest.NewProxy(t, addr)
		name := redistest.Name(t)
		a := must(proxiedClient(t, px, nil, redisync.WithCrashTimeout(lease)).NewMutex(name))
		b := must(newClient(t, addr).NewMutex(name))
		// A warm connection, with the scripts loaded, before the delay.
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		px.DelayReplies(delay)

		actx, cancel := context.WithTimeout(ctx, time.Second)
		aDone := lockAsync(a, actx)
		// Once A's acquire has run in Redis, B waits for the lock.
		eventually(t, 5*time.Second, "A's acquire to run in Redis", func() bool {
			return heldOn(t, rdb, lockKey(name))
		})
		bDone := lockAsync(b, ctx)
		ra := <-aDone
		cancel()
		aLost := isClosed(a.Lost())
		var bAt time.Time
		select {
		case rb := <-bDone:
			if rb.err != nil {
				t.Fatal(rb.err)
			}
			bAt = rb.at
		default:
		}
		if ra.err == nil {
			violations++
			bHeld := "not yet"
			if !bAt.IsZero() && bAt.Before(ra.at) {
				bHeld = fmt.Sprintf("since %v before", ra.at.Sub(bAt).Round(time.Millisecond))
			}
			t.Errorf("trial %d: A's Lock returned nil with every reply %v late on a %v lease (A's Lost closed at return: %v; B holding: %s)",
				i, delay, lease, aLost, bHeld)
		} else {
			t.Logf("trial %d: A's Lock: %v", i, ra.err)
		}
		px.DelayReplies(0)
		if bAt.IsZero() {
			await(t, bDone, 5*time.Second, "B's Lock")
		}
		_ = b.Unlock(ctx)
		uctx, ucancel := context.WithTimeout(ctx, time.Second)
		_ = a.Unlock(uctx)
		ucancel()
	}
	if violations > 0 {
		t.Fatalf("%d of %d trials returned an expired hold", violations, trials)
	}
}

// With a stalled Redis: after Redis stalls past the lease, Lock must not
// return a hold whose Lost is closed at once: either a hold valid for a
// lease from a fresh call, or an error.
func TestStallNeverReturnsLostHold(t *testing.T) {
	const lease, stall = 200 * time.Millisecond, 600 * time.Millisecond
	srv := redistest.Spawn(t)
	m := must(newClient(t, srv.Addr, redisync.WithCrashTimeout(lease)).NewMutex(redistest.Name(t)))
	// A first Lock, so the connection and the script are ready.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	srv.Signal(t, syscall.SIGSTOP)
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	done := lockAsync(m, lctx)
	// The stall, longer than the lease (a deliberate pause).
	time.Sleep(stall)
	srv.Signal(t, syscall.SIGCONT)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Lock hangs after the stall")
	}
	if r.err != nil {
		t.Logf("Lock after the stall: %v", r.err) // allowed: no hold returned
		return
	}
	lost := m.Lost()
	select {
	case <-lost:
		t.Fatalf("Lock returned nil after a %v stall and its Lost closed %v later, on a healthy Redis: it returned a hold already past its deadline",
			stall, time.Since(r.at).Round(time.Millisecond))
	case <-time.After(lease):
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
