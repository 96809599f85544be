package redisync

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Review 3, finding 1: Release of a lost holding hands s.op to a clean-up
// through c.cleanup(ctx, ...) with the caller's ctx. When that ctx's
// deadline passed more than cleanupWait ago (a deferred Release after a
// timeout, which Release documents as supported), graceEnd(ctx) is in the
// past, callFor sees its context ended and never runs the clean-up: s.end()
// is never called and every later call of s blocks on s.op.
func TestReview3LostReleaseWithExpiredCtxLeaksOpTurn(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// A lease short enough that the loss is seen soon, long enough that
	// the later holding is not lost to a starved watchdog under -race.
	c := newClient(t, rdb, WithWatchdogLease(300*time.Millisecond))
	s := c.NewSemaphore("s", 2)

	// Long enough for the Acquire (a new Client's first call loads the
	// scripts) on a loaded machine; the test waits for it to pass.
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := s.Acquire(tctx, 1); err != nil {
		t.Fatal(err)
	}
	lost := s.Lost()
	mr.Del(semKey) // the permits are lost
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("not lost")
	}
	<-tctx.Done()
	time.Sleep(50 * time.Millisecond) // the deadline passed > cleanupWait ago

	// The deferred Release of the timed-out call.
	if err := s.Release(tctx, 1); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release of the lost holding: %v, want ErrLockLost", err)
	}
	if s.Held() != 0 {
		t.Fatalf("held %d", s.Held())
	}
	// s holds nothing: a new Acquire must succeed at once.
	actx, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if err := s.Acquire(actx, 1); err != nil {
		t.Fatalf("Acquire after Release of a lost holding: %v (s.op was never given back)", err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// replayAround is a go-redis hook that, once armed, runs the next EVALSHA
// of a script, then between(), then the same command again (the caller
// sees the second reply): go-redis retrying after a lost reply, with
// another client's call landing in Redis between the two copies.
type replayAround struct {
	sha     string
	between func()
}

func (h *replayAround) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *replayAround) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *replayAround) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if h.sha == "" || cmd.Name() != "evalsha" || len(args) < 2 || args[1] != h.sha {
			return next(ctx, cmd)
		}
		h.sha = ""
		if err := next(ctx, cmd); err != nil {
			return err
		}
		h.between()
		return next(ctx, cmd)
	}
}

// Review 3, finding 2: sem_acquire.lua is not idempotent for an Acquire's
// first attempt (ARGV[9] = "0") that queued the call when a release grants
// the queued call before go-redis's retry of the attempt arrives: the
// retry finds the call neither queued nor recorded (the grant kept the
// holder record's old call number), so it grants (or queues) it again.
// Redis then counts 2n permits for the holding, the value n; the watchdog
// renews the extra n for as long as the holding lasts.
func TestReview3RetriedFirstAttemptAfterGrantDoublesPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdbW := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	rdbX := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdbW.Close(); _ = rdbX.Close() })
	hook := &replayAround{}
	rdbW.AddHook(hook)
	cw, cx := newClient(t, rdbW), newClient(t, rdbX)
	x, w := cx.NewSemaphore("s", 3), cw.NewSemaphore("s", 3)
	if err := x.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// w's first attempt queues it; X releases 2 (granting w's call 1)
	// before the retry of that attempt arrives.
	hook.between = func() {
		if err := x.Release(ctx, 2); err != nil {
			t.Error(err)
		}
	}
	hook.sha = semAcquireScript.Hash()
	if err := w.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if w.Held() != 1 {
		t.Fatalf("w holds %d", w.Held())
	}
	if got := permitsOf(mr, w); got != "1" {
		t.Fatalf("Redis counts %s permits for w's holding, w holds 1", got)
	}
}

// Review 3, finding 3: an attempt that found its call dequeued (dropped
// as dead, or granted and lost since) gets {-4}: the script marks the
// waiter id withdrawn so that the call goes on under a new id. go-redis's
// retry of that same attempt finds the id withdrawn and gets {-3}, which
// attempt turns into an error: the Acquire fails with "call ... was
// withdrawn" although nothing went wrong but a lost reply.
func TestReview3RetriedRotationFailsAcquire(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb, WithHeartbeat(30*time.Millisecond), WithRecheck(time.Hour))
	holder, w := c.NewSemaphore("s", 1), c.NewSemaphore("s", 1)
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, w, 1)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	// Dropped as dead; its next attempt is retried by go-redis.
	cnt.armReplay(semAcquireScript)
	dropAsDead(t, mr, queuedWaiter(t, mr))
	eventually(t, 5*time.Second, "the waiter to queue again", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Acquire returned while the semaphore is held: %v", err)
		default:
		}
		return queueLen(t, mr) == 1 && asleep(c) == 1
	})
	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if err := w.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// Review 3, finding 4: a Release racing Close. Close loses every holding
// (watchdog stop) and then releases it in Redis with releaseAll, which
// reads h.n under s.op. A Release that gets s.op between the two finds the
// holding lost, forgets its permits locally (dropLocked) and returns
// ErrClosed, "Close released it", without sending anything; releaseAll
// then reads h.n == 0 and sends nothing either. The permits stay counted
// in Redis until their lease ends (30 s by default) although both calls
// say they were given back.
func TestReview3ReleaseRacingCloseLeavesPermits(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewSemaphore("s", 2)
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	lost := s.Lost()
	s.op <- struct{}{} // stands for a call of s talking to Redis
	released := make(chan error, 1)
	go func() { released <- s.Release(ctx, 2) }() // a deferred Release, queued first on s.op
	time.Sleep(50 * time.Millisecond)
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	<-lost                            // Close stopped the watchdog and lost the holding
	time.Sleep(50 * time.Millisecond) // releaseAll waits for s.op, behind Release
	<-s.op
	<-closed
	if err := <-released; !errors.Is(err, ErrClosed) {
		t.Fatalf("Release racing Close: %v", err)
	}
	if got := permitsOf2(mr); got != "" {
		t.Fatalf("after Release and Close both returned, Redis still counts %q permits of the holding", got)
	}
}

// permitsOf2 returns the permits of the only holder in Redis.
func permitsOf2(mr *miniredis.Miniredis) string {
	if !mr.Exists(semKey) {
		return ""
	}
	ks, _ := mr.HKeys(semKey)
	if len(ks) == 0 {
		return ""
	}
	v := mr.HGet(semKey, ks[0])
	p, _, _ := strings.Cut(v, ":")
	return p
}

// replyError is an error reply from Redis (as an OOM or a script error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// failOnce fails the next EVALSHA of a script with an error reply, without
// running it.
type failOnce struct {
	sha atomic.Value
	msg string // the error reply; an OOM when empty
}

func (h *failOnce) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if sha, _ := h.sha.Load().(string); sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == sha {
			h.sha.Store("")
			err := replyError(cmp.Or(h.msg, "OOM command not allowed when used memory > 'maxmemory'."))
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// Review 3, finding 5: a partial Release that failed forgot the n
// permits locally, while they stayed in the holding's record, renewed with
// the rest for as long as the holding lasted. A failed partial release may
// have run or not, whatever the error (an error reply may answer go-redis's
// retry of a copy that ran: review 4), so the holding is given up: nothing
// renews permits that s cannot count, and they run out within a lease.
func TestReview3FailedPartialReleaseKeepsPermitsRenewed(t *testing.T) {
	for _, refused := range []bool{true, false} {
		t.Run(map[bool]string{true: "refused", false: "unknown"}[refused], func(t *testing.T) {
			mr := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			fail, cut := &failOnce{}, &runThenFail{}
			rdb.AddHook(fail)
			rdb.AddHook(cut)
			c := newClient(t, rdb, WithWatchdogLease(300*time.Millisecond))
			s := c.NewSemaphore("s", 3)
			if err := s.Acquire(ctx, 3); err != nil {
				t.Fatal(err)
			}
			if refused {
				fail.sha.Store(semReleaseScript.Hash())
			} else {
				cut.sha.Store(semReleaseScript.Hash()) // it does not run: Redis counts 3
			}
			if err := s.Release(ctx, 1); err == nil {
				t.Fatal("the release did not fail")
			}
			select {
			case <-s.Lost():
			default:
				t.Fatal("the holding goes on after a release of unknown outcome")
			}
			// Unrenewed, the holding runs out in Redis within its lease.
			other := c.NewSemaphore("s", 3)
			eventually(t, 5*time.Second, "the permits to run out", func() bool {
				ok, err := other.TryAcquire(ctx, 3)
				return err == nil && ok
			})
		})
	}
}

// runThenFail makes the next EVALSHA of a script fail with an error that
// is not a reply, without running it.
type runThenFail struct{ sha atomic.Value }

func (h *runThenFail) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *runThenFail) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *runThenFail) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if sha, _ := h.sha.Load().(string); sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == sha {
			h.sha.Store("")
			err := errors.New("redis: reply cut short")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// Review 3, finding 6: an Acquire's holder id is fixed when the call
// starts (newCall). When the value's holding ends while the call waits (a
// full Release that failed: its permits stay counted in Redis until their
// lease ends), the call's grant is added to that old record and the value
// makes it its new holding, under the old id: the watchdog renews the old
// permits along with the new ones, for good.
func TestReview3QueuedAcquireRevivesReleasedHoldingsPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	rdbX := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close(); _ = rdbX.Close() })
	hook := &failOnce{}
	rdb.AddHook(hook)
	c := newClient(t, rdb, WithWatchdogLease(300*time.Millisecond), WithRecheck(time.Hour))
	cx := newClient(t, rdbX)
	s, x := c.NewSemaphore("s", 2), cx.NewSemaphore("s", 2)
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	old := s.holdID()
	if err := x.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, s, 1)
	eventually(t, 5*time.Second, "the Acquire to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	hook.sha.Store(semReleaseScript.Hash())
	if err := s.Release(ctx, 1); err == nil {
		t.Fatal("the release did not fail")
	}
	if err := x.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if s.Held() != 1 {
		t.Fatalf("held %d", s.Held())
	}
	if s.holdID() == old {
		t.Fatalf("the new holding has the id %s of the one whose release failed", old)
	}
	// The failed release's permit runs out unrenewed: the permit that s
	// does not hold is free again within a lease.
	other := cx.NewSemaphore("s", 2)
	eventually(t, 5*time.Second, "the failed release's permit to run out", func() bool {
		ok, err := other.TryAcquire(ctx, 1)
		return err == nil && ok
	})
	if got := permitsOf(mr, s); got != "1" {
		t.Fatalf("Redis counts %s permits for a holding of 1", got)
	}
}

// A holding that ends with a confirmed release while an Acquire of the
// same value is queued onto it: the grant to that Acquire makes a holding
// anew under its id, in its place in the queue. Every call of the old
// holding counts as applied to the new one: a stale copy of a partial
// release of the old holding, delivered late, takes nothing from it.
func TestSemaphoreHoldingEndsWhileAcquireQueued(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &beforeNext{}
	rdb.AddHook(hook)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	s, x, y := c.NewSemaphore("s", 3), c.NewSemaphore("s", 3), c.NewSemaphore("s", 3)
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := x.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	id := s.holdID()
	done := acquireAsync(ctx, s, 2)
	eventually(t, 5*time.Second, "s's Acquire to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	behind := acquireAsync(ctx, y, 1)
	eventually(t, 5*time.Second, "y's Acquire to queue behind it", func() bool { return queueLen(t, mr) == 2 && asleep(c) == 2 })
	if err := s.Release(ctx, 1); err != nil { // partial: the holding goes on
		t.Fatal(err)
	}
	if err := s.lockOp(ctx); err != nil {
		t.Fatal(err)
	}
	partial := s.seq
	s.end()
	// Between the grant and the attempt that takes it, a stale copy of
	// the partial release arrives.
	stale := func() (int64, error) { return s.release(ctx, id, partial, 1, 2, "release", "") }
	hook.set(semAcquireScript.Hash(), func() {
		if _, err := stale(); err != nil {
			t.Error(err)
		}
	})
	if err := s.Release(ctx, 1); err != nil { // the last: s's Acquire is granted
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if s.Held() != 2 || s.holdID() != id || permitsOf(mr, s) != "2" {
		t.Fatalf("s holds %d under %s, Redis counts %s; want 2 under %s, 2", s.Held(), s.holdID(), permitsOf(mr, s), id)
	}
	if queueLen(t, mr) != 1 {
		t.Fatal("y's place in the queue is gone")
	}
	// And another, later.
	if err := s.lockOp(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := stale()
	s.end()
	if err != nil || permitsOf(mr, s) != "2" {
		t.Fatalf("a stale copy of the partial release: %v, %v; Redis counts %s permits for s's holding of 2", res, err, permitsOf(mr, s))
	}
	if err := x.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, behind); err != nil {
		t.Fatal(err)
	}
}

// beforeNext runs fn before the next EVALSHA of a script.
type beforeNext struct {
	mu  sync.Mutex
	sha string
	fn  func()
}

func (h *beforeNext) set(sha string, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.fn = sha, fn
}

func (h *beforeNext) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *beforeNext) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *beforeNext) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		var fn func()
		if h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha {
			fn, h.sha = h.fn, ""
		}
		h.mu.Unlock()
		if fn != nil {
			fn()
		}
		return next(ctx, cmd)
	}
}
