package fault

import (
	"context"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestHeartbeatDoesNotDelayLost: no slow call of any kind, such as a fair
// waiter's heartbeat, may delay the notice that a hold is lost.
//
// Client A (through a proxy) has a fair waiter queued on lock Y, held by
// Client B (direct), with the default heartbeat of 3 s; then A takes lock X
// with a watchdog lease of 300 ms, and its connection is blackholed at
// once. A's Lost for X must close by its local deadline (give or take the
// machine's scheduling), before B, trying all along, takes X. Three trials
// take X 190, 210 and 230 ms before A's first heartbeat is due (1 s after
// it queued). The watchdog sends a heartbeat up to a sixth of its interval
// early (167 ms), so it goes out 23-63 ms after the cut, into the
// blackhole, and its batch is given up only when the heartbeat's TTL (3 s)
// has passed: a watchdog that waited for its batches would report X's
// loss seconds late.
func TestHeartbeatDoesNotDelayLost(t *testing.T) {
	const (
		lease     = 300 * time.Millisecond
		drift     = lease/100 + 2*time.Millisecond // the watchdog's margin
		slack     = 25 * time.Millisecond
		heartbeat = 3 * time.Second // the default
	)
	for trial, before := range []time.Duration{190 * time.Millisecond, 210 * time.Millisecond, 230 * time.Millisecond} {
		addr := redistest.Addr(t)
		admin := redistest.NewClient(t, addr)
		px := redistest.NewProxy(t, addr)
		x, y := redistest.Name(t)+"-x", redistest.Name(t)+"-y"
		b := newClient(t, addr)
		a := newClient(t, px.Addr)

		bY := must(b.NewMutex(y))
		if err := bY.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		aY := must(a.NewMutex(y))
		yctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		yDone := lockAsync(aY, yctx)
		eventually(t, 5*time.Second, "A's waiter to queue on Y", func() bool {
			return queued(t, admin, y) == 1 && subscribers(t, admin, y) == 1
		})
		queuedAt := time.Now()

		// Take X just before the heartbeat falls due (a deliberate
		// timing), then cut A off.
		<-time.After(time.Until(queuedAt.Add(heartbeat/3 - before)))
		aX := must(a.NewMutex(x, redisync.WithCrashTimeout(lease)))
		if err := aX.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		px.SetBlackhole(true)
		cut := time.Now()
		lost := aX.Lost()
		lostAt := closedAt(lost)

		bX := must(b.NewMutex(x))
		got, lostFirst := grab(t, bX, lost, lease+3*time.Second)
		var la time.Time
		select {
		case la = <-lostAt:
		case <-time.After(3 * time.Second):
			t.Fatalf("trial %d (X taken %v before the heartbeat): B held X %v after the cut; A's Lost for X still open 3s later",
				trial, before, got.Sub(cut).Round(time.Millisecond))
		}
		// A's local deadline for X is at the latest the cut + the lease
		// - the drift margin (its Lock was sent before the cut), which
		// is before Redis lets B in. A watchdog that waited on the
		// heartbeat's batch would close Lost seconds past it; a
		// loaded test machine may run A's timer a few milliseconds late
		// (assumption A3), which slack allows.
		late := la.Sub(cut.Add(lease - drift))
		t.Logf("trial %d (X taken %v before the heartbeat): cut to A's Lost %v (%v past the deadline), cut to B holding X %v, Lost first: %v",
			trial, before, la.Sub(cut).Round(time.Millisecond), late.Round(time.Millisecond), got.Sub(cut).Round(time.Millisecond), lostFirst)
		if late > slack {
			t.Errorf("trial %d (X taken %v before the heartbeat): A's Lost for X closed %v after its deadline (B held X %v after the cut, Lost %v)",
				trial, before, late.Round(time.Millisecond), got.Sub(cut).Round(time.Millisecond), la.Sub(cut).Round(time.Millisecond))
		}

		px.SetBlackhole(false)
		px.ResetAll()
		cancel()
		<-yDone
		if err := bX.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := bY.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		unlockQuietly(aX)
	}
}
