package fault

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestWakeTakenByEndingWaiterIsPassedOn: the wake-up a
// release sends to a Client must reach a waiter that can use it, even when
// it is delivered to a waiter whose context ends at that very instant.
//
// Each trial: a direct Client holds a plain (non-fair) lock; two waiters of
// one other Client (recheck 10 s, so that only the wake-up can get them
// the lock in time) block on it, the ending one first; the holder
// releases, and the ending waiter's context is cancelled a seeded random
// 0-300 µs after the release returned, about when the wake-up reaches it.
// The other waiter must hold the lock within 1 s of the release (or of the
// ending waiter's Unlock, when that one got the lock after all). Were it
// not passed on, a wake-up consumed by the ending waiter's wait just
// before its context ends would be lost, and the other waiter would sleep
// 10 s.
func TestWakeTakenByEndingWaiterIsPassedOn(t *testing.T) {
	const trials = 300
	srv := redistest.Spawn(t) // of its own: the test counts its commands
	admin := redistest.NewClient(t, srv.Addr)
	name := redistest.Name(t)
	holder := must(newClient(t, srv.Addr).NewMutex(name, redisync.Barging())) // a plain wake-up: barging waiters
	c := newClient(t, srv.Addr, redisync.WithRecheck(10*time.Second))
	rng := rand.New(rand.NewPCG(6, 6))
	lctx, cancelAll := context.WithTimeout(ctx, time.Minute)
	defer cancelAll()

	// sent waits until Redis has run a command more than n (not counting
	// the probe's own), and returns the new count: a waiter's Lock has
	// made its first attempt, so it is registered and found the lock held.
	sent := func(n int64, what string) int64 {
		t.Helper()
		var now int64
		eventually(t, 5*time.Second, what, func() bool {
			now = othersCommands(t, admin)
			return now > n
		})
		return now
	}

	var ended, acquiredAnyway int
	for i := range trials {
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		n := othersCommands(t, admin)
		ectx, end := context.WithCancel(lctx)
		ending := must(c.NewMutex(name, redisync.Barging()))
		endingDone := lockAsync(ending, ectx)
		n = sent(n, "the ending waiter's first attempt")
		other := must(c.NewMutex(name, redisync.Barging()))
		otherDone := lockAsync(other, lctx)
		sent(n, "the other waiter's first attempt")

		offset := time.Duration(rng.Int64N(int64(300 * time.Microsecond)))
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		for time.Since(released) < offset { // a spin: sleeping is far too coarse
		}
		end()
		r := <-endingDone
		switch {
		case r.err == nil:
			// The ending waiter's attempt went out before its context
			// ended: it holds the lock, and passes it on.
			acquiredAnyway++
			released = time.Now()
			if err := ending.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		case errors.Is(r.err, context.Canceled):
			ended++
		default:
			t.Fatalf("trial %d: the ending waiter: %v", i, r.err)
		}
		select {
		case o := <-otherDone:
			if o.err != nil {
				t.Fatal(o.err)
			}
			if d := o.at.Sub(released); d > time.Second {
				t.Fatalf("trial %d: the other waiter held the lock %v after the release", i, d)
			}
		case <-time.After(time.Second):
			cancelAll()
			<-otherDone
			t.Fatalf("trial %d (cancel %v after the release): the other waiter did not hold the lock within 1s of the release (recheck 10s): the wake-up was swallowed by the waiter whose context ended (%d trials ended, %d acquired anyway before)",
				i, offset, ended, acquiredAnyway)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d trials: the ending waiter ended %d times, held the lock anyway %d times; no wake-up swallowed", trials, ended, acquiredAnyway)
}
