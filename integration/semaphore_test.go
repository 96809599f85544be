package integration

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// semKeys returns the Redis keys of the semaphore called name: its queue,
// and its hash, which holds the waiters' records.
func semKeys(name string) (queue, hash string) {
	base := "redisync:sem:{" + name + "}"
	return base + ":queue", base
}

func TestSemaphoreNeverOversubscribed(t *testing.T) {
	const size, goroutines, rounds = 5, 50, 4
	name := redistest.Name(t)
	clients := newClients(t, 5)
	cnt := cmdCounter{admin(t)}
	// Two goroutines share each Semaphore value, as with a Weighted.
	values := make([]*redisync.Semaphore, goroutines/2)
	for i := range values {
		values[i] = must(clients[i%len(clients)].NewSemaphore(name, size))
	}
	var used, maxUsed, acquisitions atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	evalBefore, totalBefore := callsOf(t, cnt, "fcall")+callsOf(t, cnt, "evalsha")+callsOf(t, cnt, "eval"), cnt.total(t)
	start := time.Now()

	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for i := range goroutines {
		wg.Go(func() {
			s, n := values[i%len(values)], int64(1+i%3)
			for range rounds {
				if err := s.Acquire(ctx, n); err != nil {
					errs <- err
					return
				}
				u := used.Add(n)
				for m := maxUsed.Load(); u > m && !maxUsed.CompareAndSwap(m, u); m = maxUsed.Load() {
				}
				acquisitions.Add(1)
				time.Sleep(time.Millisecond) // the critical section
				used.Add(-n)
				if err := s.Release(ctx, n); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := maxUsed.Load(); m > size {
		t.Fatalf("%d permits in use at once, size %d", m, size)
	}
	if got := acquisitions.Load(); got != goroutines*rounds {
		t.Fatalf("%d acquisitions, want %d", got, goroutines*rounds)
	}
	scripts := callsOf(t, cnt, "fcall") + callsOf(t, cnt, "evalsha") + callsOf(t, cnt, "eval") - evalBefore
	total := cnt.total(t) - totalBefore
	t.Logf("%d Acquire+Release in %v, at most %d permits in use; per Acquire+Release: %.2f script calls, %.1f commands with scripts' inner calls",
		acquisitions.Load(), time.Since(start).Round(time.Millisecond), maxUsed.Load(),
		float64(scripts)/float64(acquisitions.Load()), float64(total)/float64(acquisitions.Load()))
}

func TestSemaphoreCrashedHolderFreesPermitsWithinLease(t *testing.T) {
	const lease = time.Second
	t.Run("fixed lease", func(t *testing.T) {
		testCrashedHolder(t, lease, redisync.WithFixedLease(lease))
	})
	t.Run("watchdog lease", func(t *testing.T) {
		testCrashedHolder(t, lease, redisync.WithCrashTimeout(lease))
	})
}

// testCrashedHolder checks that a holder whose Client is closed without
// Release loses its permits to a waiter within lease + 300ms.
func testCrashedHolder(t *testing.T, lease time.Duration, opt redisync.Option) {
	name := redistest.Name(t)
	cs := newClients(t, 2, opt, redisync.WithRecheck(time.Hour))
	holder, waiter := must(cs[0].NewSemaphore(name, 3)), must(cs[1].NewSemaphore(name, 3))
	acquired := time.Now()
	if err := holder.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- waiter.Acquire(ctx, 2) }()
	queue, _ := semKeys(name)
	rdb := admin(t)
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return rdb.ZCard(ctx, queue).Val() == 1 })
	_ = cs[0].Close() // the holder's process dies: no Release

	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(lease + 300*time.Millisecond - time.Since(acquired)):
		t.Fatalf("the crashed holder's permits were not granted to the waiter within lease + 300ms")
	}
	t.Logf("waiter served %v after the holder acquired (lease %v)", time.Since(acquired).Round(time.Millisecond), lease)
	if err := waiter.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreLargeRequestServedInItsTurn(t *testing.T) {
	const size = 3
	name := redistest.Name(t)
	cs := newClients(t, 3)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	// A stream of 1-permit requests keeps the semaphore saturated: more
	// requests than permits, so that some are always waiting.
	var stop atomic.Bool
	var mu sync.Mutex
	var served []struct{ start, end time.Time } // 1-permit requests
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		s := must(cs[i%2].NewSemaphore(name, size))
		// Holds of different lengths, so that the holders do not fall
		// into step and free all the permits at once by chance.
		hold := time.Duration(3+i%5) * time.Millisecond
		wg.Go(func() {
			for !stop.Load() {
				start := time.Now()
				if err := s.Acquire(ctx, 1); err != nil {
					errs <- err
					return
				}
				end := time.Now()
				time.Sleep(hold) // the critical section
				if err := s.Release(ctx, 1); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				served = append(served, struct{ start, end time.Time }{start, end})
				mu.Unlock()
			}
		})
	}
	eventually(t, 5*time.Second, "the stream to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(served) >= 20
	})

	big := must(cs[2].NewSemaphore(name, size))
	done := make(chan error, 1)
	go func() { done <- big.Acquire(ctx, 3) }()
	_, hash := semKeys(name)
	rdb := admin(t)
	var queuedAt time.Time // observed after the big request queued
	eventually(t, 5*time.Second, "the waiter for 3 to queue", func() bool {
		for _, v := range rdb.HVals(ctx, hash).Val() {
			// "deadline:lease:permits:call"
			if f := strings.Split(v, ":"); len(f) == 4 && f[2] == "3" {
				queuedAt = time.Now()
				return true
			}
		}
		return false
	})
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter for 3 permits was starved by the stream of 1-permit requests")
	}
	grantedAt := time.Now()
	stop.Store(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := big.Release(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A 1-permit request that started after the waiter for 3 queued came
	// after it: it cannot be served before it (it returns after the waiter
	// for 3 released all the permits, so after grantedAt).
	mu.Lock()
	defer mu.Unlock()
	for _, r := range served {
		if r.start.After(queuedAt) && r.end.Before(grantedAt) {
			t.Fatalf("a 1-permit request started %v after the waiter for 3 queued was served before it",
				r.start.Sub(queuedAt))
		}
	}
	t.Logf("waiter for 3 served %v after queueing, %d 1-permit requests in all",
		grantedAt.Sub(queuedAt).Round(time.Millisecond), len(served))
}

func TestSemaphoreSizeMismatch(t *testing.T) {
	name := redistest.Name(t)
	cs := newClients(t, 2)
	a := must(cs[0].NewSemaphore(name, 3))
	if err := a.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	b := must(cs[1].NewSemaphore(name, 4))
	if err := b.Acquire(ctx, 4); !errors.Is(err, redisync.ErrInvalidPermits) || b.Size() != 3 {
		t.Fatalf("Acquire of 4 with size 3 stored: %v, size %d; want ErrInvalidPermits, 3", err, b.Size())
	}
	if got := admin(t).HGet(ctx, schema.SemaphoreKeys(schema.DefaultPrefix, name).Hash, "{size}").Val(); got != "3:"+strconv.Itoa(schema.SemLayout) {
		t.Fatalf("stored size %q, want 3:%d (size:layout)", got, schema.SemLayout)
	}
	if err := a.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreWaitersDoNotPoll(t *testing.T) {
	const waiters = 10
	name := redistest.Name(t)
	// Long heartbeat and recheck: nothing is due during the measurement.
	cs := newClients(t, 2, redisync.WithRecheck(time.Hour), redisync.WithWaiterTimeout(time.Minute))
	holder := must(cs[0].NewSemaphore(name, 1))
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, waiters)
	for i := range waiters {
		s := must(cs[i%2].NewSemaphore(name, 1))
		go func() {
			err := s.Acquire(ctx, 1)
			if err == nil {
				err = s.Release(ctx, 1)
			}
			done <- err
		}()
	}
	queue, _ := semKeys(name)
	rdb := admin(t)
	cnt := cmdCounter{rdb}
	eventually(t, 5*time.Second, "every waiter to queue", func() bool { return rdb.ZCard(ctx, queue).Val() == waiters })
	// Each waiter looks once more after subscribing; wait until Redis is
	// quiet (a ZCARD and an INFO per look).
	last := cnt.total(t)
	eventually(t, 5*time.Second, "the waiters to stop sending commands (are they polling?)", func() bool {
		time.Sleep(100 * time.Millisecond)
		now := cnt.total(t)
		quiet := now-last <= 2
		last = now
		return quiet
	})

	// Counted: every command but INFO (ours) and PING (the subscriber's
	// keep-alive of a silent pub/sub connection, every 3 s).
	busy := func() int64 {
		return cnt.total(t) - callsOf(t, cnt, "info") - callsOf(t, cnt, "ping")
	}
	before := busy()
	window := time.NewTimer(3 * time.Second) // the measurement, not a wait for a condition
	<-window.C
	if n := busy() - before; n > 0 {
		t.Fatalf("%d commands in 3 s while %d waiters were blocked", n, waiters)
	}

	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiters were not served one after another")
		}
	}
}
