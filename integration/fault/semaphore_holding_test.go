package fault

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// Tests of a semaphore holding's life across lost permits, partial
// releases and dead waiters, and of a cancelled Lock's return: each says
// the interleaving it forces.

// semScript tells the semaphore's script calls apart by their keys and
// their mode argument.
func semScript(args []string, name string) string {
	if args == nil || !argContains(args, semKey(name)) {
		return ""
	}
	switch {
	case slices.Contains(args, "sem"): // an entry's kind
		return "renew"
	case slices.ContainsFunc(args, modeOf("queue", "try")):
		return "acquire"
	case slices.ContainsFunc(args, modeOf("release", "withdraw")):
		return "release"
	}
	return ""
}

// modeOf returns whether an argument is a semaphore script's mode
// argument (mode, then flags) with one of the modes.
func modeOf(modes ...string) func(string) bool {
	return func(a string) bool {
		mode, _, _ := strings.Cut(a, " ")
		return slices.Contains(modes, mode)
	}
}

// A Semaphore value whose permits were lost locally (their deadline
// passed unrenewed) while Redis still holds them forgets them on Release
// without telling Redis (ErrLockLost, nothing sent). Its next Acquire then
// adds the new permits to the holder's record in Redis (holder ids are per
// value, not per call): the lingering permits are merged into the new hold
// and renewed by the watchdog for as long as the value holds anything. The
// documented "Redis frees them within one lease" never happens: the
// semaphore has one permit fewer for everyone, indefinitely.
func TestSemaphoreLostPermitsNotRevivedByNextAcquire(t *testing.T) {
	const lease = 600 * time.Millisecond
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)

	var delayAcquire, delayRenew atomic.Bool
	hook := hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		switch semScript(scriptArgs(cmd), name) {
		case "acquire":
			if delayAcquire.Load() {
				// The request is slow on its way: Redis sets the lease
				// 200 ms after the call was sent.
				time.Sleep(200 * time.Millisecond)
			}
		case "renew":
			if delayRenew.Load() {
				time.Sleep(1500 * time.Millisecond) // abandoned at the deadline
			}
		}
		return next(ctx, cmd)
	})
	ra := redistest.NewClient(t, addr)
	ra.AddHook(hook)
	a, err := redisync.New(ra, withHook(hook), redisync.WithCrashTimeout(lease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	sa := must(a.NewSemaphore(name, 2))

	delayAcquire.Store(true)
	delayRenew.Store(true)
	if err := sa.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	delayAcquire.Store(false)
	select {
	case <-sa.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the permit was not lost")
	}
	delayRenew.Store(false)
	err = sa.Release(ctx, 1)
	t.Logf("Release after the loss: %v", err)
	if !errors.Is(err, redisync.ErrLockLost) {
		t.Fatalf("Release of lost permits: %v", err)
	}
	t.Logf("in Redis right after the Release: %v", rdb.HGetAll(ctx, semKey(name)).Val())

	// The value acquires one permit again, while Redis still counts the
	// lost one (its lease in Redis ends ~200 ms after the local deadline).
	if err := sa.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the new Acquire: Held()=%d, in Redis %v", sa.Held(), rdb.HGetAll(ctx, semKey(name)).Val())

	// Wait for three leases: the lost permit should be long gone.
	time.Sleep(3 * lease)
	rec := rdb.HGetAll(ctx, semKey(name)).Val()
	t.Logf("three leases later: Held()=%d, Lost closed=%v, in Redis %v", sa.Held(), isClosed(sa.Lost()), rec)

	b := must(newClient(t, addr).NewSemaphore(name, 2))
	ok, err := b.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		_ = b.Release(ctx, 1)
	}
	if !ok {
		t.Errorf("size 2, one permit held (by a value that knows of 1), yet another value cannot take the second one three leases after the loss: Redis %v", rec)
	}
	_ = sa.Release(ctx, 1)
}

// "every blocking call returns within 25 ms of the end of its
// context". The reply grace and the clean-up wait share one budget only
// when the ctx ended by its deadline (GraceEnd counts from the deadline);
// a ctx that is cancelled gets CleanupWait from now twice: once for the
// reply of the attempt in flight, and again for the withdrawal of the
// place that reply gave it. A Lock cancelled during an attempt whose reply
// comes 20 ms later returns ~45 ms after the cancellation. (The deadline
// subtest, the same scenario ended by a deadline, passes.)
func TestCancelledLockReturnsWithinCleanupWait(t *testing.T) {
	for _, byDeadline := range []bool{true, false} {
		tcName := "cancel"
		if byDeadline {
			tcName = "deadline"
		}
		t.Run(tcName, func(t *testing.T) {
			addr := redistest.Addr(t)
			name := redistest.Name(t)
			var slow atomic.Bool
			hook := hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
				args := scriptArgs(cmd)
				if !slow.Load() || !argContains(args, lockKey(name)) {
					return next(ctx, cmd)
				}
				switch {
				case hasArg(args, "withdraw"):
					time.Sleep(200 * time.Millisecond)
				case hasArg(args, "queue"):
					err := next(ctx, cmd)
					time.Sleep(20 * time.Millisecond) // the reply is on its way
					return err
				}
				return next(ctx, cmd)
			})
			ra := redistest.NewClient(t, addr)
			ra.AddHook(hook)
			a, err := redisync.New(ra, withHook(hook))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			b := must(newClient(t, addr).NewMutex(name))
			if err := b.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			defer unlockQuietly(b)
			m := must(a.NewMutex(name))
			if ok, err := m.TryLock(ctx); ok || err != nil { // loads the scripts
				t.Fatal(ok, err)
			}
			slow.Store(true)
			defer slow.Store(false)

			var lctx context.Context
			var cancel context.CancelFunc
			var ended atomic.Int64 // unix ns
			if byDeadline {
				lctx, cancel = context.WithTimeout(ctx, 2*time.Millisecond)
				dl, _ := lctx.Deadline()
				ended.Store(dl.UnixNano())
			} else {
				lctx, cancel = context.WithCancel(ctx)
				time.AfterFunc(2*time.Millisecond, func() {
					ended.Store(time.Now().UnixNano())
					cancel()
				})
			}
			defer cancel()
			err = m.Lock(lctx)
			late := time.Since(time.Unix(0, ended.Load()))
			t.Logf("Lock: %v, returned %v after its ctx ended", err, late)
			if err == nil {
				t.Fatal("Lock took a held lock")
			}
			if late > 35*time.Millisecond {
				t.Errorf("Lock returned %v after its ctx ended (the contract: within 25 ms)", late)
			}
		})
	}
}

// Release gives back s's turn to talk to Redis (op) before it drops
// the permits it released from its count. A call of the same value that
// takes the turn in between (another Release, an Acquire's attempt) sends
// the stale count as "held", finds fewer permits in Redis, and is told the
// permits were lost: a spurious ErrLockLost, and Lost closes on permits
// that are held and renewed.
func TestSemaphoreConcurrentPartialReleasesKeepHold(t *testing.T) {
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	c := newClient(t, addr)
	s := must(c.NewSemaphore(name, 1000))
	deadline := time.Now().Add(10 * time.Second)
	for round := 0; time.Now().Before(deadline); round++ {
		if err := s.Acquire(ctx, 64); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 64)
		for g := 0; g < 4; g++ {
			go func() {
				for i := 0; i < 16; i++ {
					if err := s.Release(ctx, 1); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for g := 0; g < 4; g++ {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: a partial Release of held permits failed: %v (Lost closed: %v, Held %d)", round, err, isClosed(s.Lost()), s.Held())
			}
		}
		if s.Held() != 0 {
			t.Fatalf("Held %d after releasing everything", s.Held())
		}
	}
}

// An Acquire on a value that holds permits adds the new permits to
// the value's hold without checking that it is still held: when the hold
// is lost while the attempt is in flight (its deadline passed unrenewed),
// Acquire returns nil (not ErrLockLost) and Held counts the new permits in
// a hold whose Lost channel is already closed and which nothing renews.
func TestSemaphoreAcquireOntoLostHoldFails(t *testing.T) {
	const lease = 600 * time.Millisecond
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	var delayReply, delayRenew atomic.Bool
	hook := hookFunc(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		switch semScript(scriptArgs(cmd), name) {
		case "acquire":
			err := next(ctx, cmd)
			if delayReply.Load() {
				time.Sleep(500 * time.Millisecond) // the reply is slow
			}
			return err
		case "renew":
			if delayRenew.Load() {
				time.Sleep(1500 * time.Millisecond)
			}
		}
		return next(ctx, cmd)
	})
	ra := redistest.NewClient(t, addr)
	ra.AddHook(hook)
	a, err := redisync.New(ra, withHook(hook), redisync.WithCrashTimeout(lease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	s := must(a.NewSemaphore(name, 3))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	delayRenew.Store(true) // the next renewals do not come back in time
	time.Sleep(lease / 3)
	delayReply.Store(true)
	err = s.Acquire(ctx, 1) // in flight when the first permit's deadline passes
	delayReply.Store(false)
	delayRenew.Store(false)
	lost := isClosed(s.Lost())
	t.Logf("Acquire: %v; Lost closed: %v; Held: %d", err, lost, s.Held())
	if err == nil && lost {
		t.Errorf("Acquire returned nil, yet the value's hold (now counting the new permit) was lost before it returned")
	}
	_ = s.Release(ctx, s.Held())
}

// A semaphore waiter stuck behind a dead head waiter is not woken
// when the head's heartbeat lapses: nothing looks at the queue until some
// script runs (a release, an attempt). The fair Mutex has the heartbeat's
// "free" nudge for this; the semaphore's is only sent when nobody holds a
// permit at all. So free permits sit idle while a live waiter sleeps to the
// earliest lease end or the recheck interval: here W, wanting 1 of the 2
// free permits behind a dead waiter for 3, waits ~the 6 s lease instead of
// about a heartbeat (1 s).
func TestSemaphoreWaiterBehindDeadHeadIsWoken(t *testing.T) {
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	opts := []redisync.Option{redisync.WithCrashTimeout(6 * time.Second),
		redisync.WithWaiterTimeout(time.Second), redisync.WithRecheck(30 * time.Second)}
	h := must(newClient(t, addr, opts...).NewSemaphore(name, 3))
	if err := h.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	defer h.Release(ctx, 1)

	px := redistest.NewProxy(t, addr)
	d := must(proxiedClient(t, px, nil, opts...).NewSemaphore(name, 3))
	dctx, dcancel := context.WithCancel(ctx)
	ddone := make(chan error, 1)
	go func() { ddone <- d.Acquire(dctx, 3) }()
	eventually(t, 5*time.Second, "the head waiter to queue", func() bool {
		return redistest.Client(t).ZCard(ctx, semKey(name)+":queue").Val() == 1
	})
	px.SetBlackhole(true) // its process is gone, as far as Redis can tell
	defer func() {
		px.SetBlackhole(false)
		dcancel()
		<-ddone
	}()

	w := must(newClient(t, addr, opts...).NewSemaphore(name, 3))
	start := time.Now()
	if err := w.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	_ = w.Release(ctx, 1)
	t.Logf("W got a free permit %v after it queued behind the dead waiter (heartbeat 1 s)", took)
	if took > 2500*time.Millisecond {
		t.Errorf("W slept %v with 2 permits free behind a waiter dead for a heartbeat", took)
	}
}
