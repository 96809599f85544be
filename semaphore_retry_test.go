package redisync

import (
	"cmp"
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// replayAround is a go-redis hook that, once armed, runs the next EVALSHA
// of a script, then between(), then the same command again (the caller
// sees the second reply): go-redis retrying after a lost reply, with
// another client's call landing in Redis between the two copies.
type replayAround struct {
	passHooks
	mu      sync.Mutex
	sha     string
	between func()
}

// arm has the hook replay the next EVALSHA of sha.
func (h *replayAround) arm(sha string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha = sha
}

func (h *replayAround) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		fire := h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha
		if fire {
			h.sha = ""
		}
		h.mu.Unlock()
		if !fire {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil {
			return err
		}
		h.between()
		return next(ctx, cmd)
	}
}

// permitsOf2 returns the permits of the only holder in Redis.
func permitsOf2(mr *miniredis.Miniredis) string {
	if !mr.Exists(semKey) {
		return ""
	}
	ks, _ := mr.HKeys(semKey)
	ks = slices.DeleteFunc(ks, func(f string) bool { return slices.Contains(schema.SemFields, f) })
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

func (replyError) RedisError() {}

// failOnce fails the next EVALSHA of a script with an error reply, without
// running it.
type failOnce struct {
	passHooks
	sha atomic.Value
	msg string // the error reply; an OOM when empty
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

// runThenFail makes the next EVALSHA of a script fail with an error that
// is not a reply, without running it.
type runThenFail struct {
	passHooks
	sha atomic.Value
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

// beforeNext runs fn before the next EVALSHA of a script.
type beforeNext struct {
	passHooks
	mu  sync.Mutex
	sha string
	fn  func()
}

func (h *beforeNext) set(sha string, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.fn = sha, fn
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

// Release of a lost holding hands s.op to a clean-up
// through c.rt.Cleanup(ctx, ...) with the caller's ctx. When that ctx's
// deadline passed more than roundtrip.CleanupWait ago (a deferred Release
// after a timeout, which Release documents as supported),
// roundtrip.GraceEnd(ctx) is in the past, the round trip sees its context
// ended and never runs the clean-up: s.end()
// is never called and every later call of s blocks on s.op.
func TestSemaphoreLostReleaseWithExpiredCtxFreesOpTurn(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// A lease short enough that the loss is seen soon, long enough that
	// the later holding is not lost to a starved watchdog under -race.
	c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond))
	s := must(c.NewSemaphore("s", 2))

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
	time.Sleep(50 * time.Millisecond) // the deadline passed > roundtrip.CleanupWait ago

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

// Sem_acquire.lua is not idempotent for an Acquire's
// first attempt (ARGV[9] = "0") that queued the call when a release grants
// the queued call before go-redis's retry of the attempt arrives: the
// retry finds the call neither queued nor recorded (the grant kept the
// holder record's old call number), so it grants (or queues) it again.
// Redis then counts 2n permits for the holding, the value n; the watchdog
// renews the extra n for as long as the holding lasts.
func TestSemaphoreRetriedFirstAttemptAfterGrantGrantsOnce(t *testing.T) {
	mr := miniredis.RunT(t)
	rdbW := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	rdbX := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdbW.Close(); _ = rdbX.Close() })
	hook := &replayAround{}
	addHook(rdbW, hook)
	cw, cx := newClient(t, rdbW), newClient(t, rdbX)
	x, w := must(cx.NewSemaphore("s", 3)), must(cw.NewSemaphore("s", 3))
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
	hook.arm(semAcquireScript.Hash())
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

// An attempt that found its call dequeued (dropped
// as dead, or granted and lost since) gets {-4}: the script marks the
// waiter id withdrawn so that the call goes on under a new id. go-redis's
// retry of that same attempt finds the id withdrawn and gets {-3}, which
// attempt turns into an error: the Acquire fails with "call ... was
// withdrawn" although nothing went wrong but a lost reply.
func TestSemaphoreRetriedRotationFailsAcquire(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb, WithWaiterTimeout(30*time.Millisecond), WithRecheck(time.Hour))
	holder, w := must(c.NewSemaphore("s", 1)), must(c.NewSemaphore("s", 1))
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

// A Release racing Close. Close loses every holding
// (watchdog stop) and then releases it in Redis with releaseAll, which
// reads h.n under s.op. A Release that gets s.op between the two finds the
// holding lost, forgets its permits locally (dropLocked) and returns
// ErrClosed, "Close released it", without sending anything; releaseAll
// then reads h.n == 0 and sends nothing either. The permits stay counted
// in Redis until their lease ends (15 s by default) although both calls
// say they were given back.
func TestSemaphoreReleaseRacingCloseLeavesPermits(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	s := must(c.NewSemaphore("s", 2))
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

// A partial Release that failed forgot the n
// permits locally, while they stayed in the holding's record, renewed with
// the rest for as long as the holding lasted. A failed partial release may
// have run or not, whatever the error (an error reply may answer go-redis's
// retry of a copy that ran), so the holding is given up: nothing
// renews permits that s cannot count, and they run out within a lease.
func TestSemaphoreFailedPartialReleaseGivesHoldingUp(t *testing.T) {
	for _, refused := range []bool{true, false} {
		t.Run(map[bool]string{true: "refused", false: "unknown"}[refused], func(t *testing.T) {
			mr := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			fail, cut := &failOnce{}, &runThenFail{}
			addHook(rdb, fail)
			addHook(rdb, cut)
			c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond))
			s := must(c.NewSemaphore("s", 3))
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
			other := must(c.NewSemaphore("s", 3))
			eventually(t, 5*time.Second, "the permits to run out", func() bool {
				ok, err := other.TryAcquire(ctx, 3)
				return err == nil && ok
			})
		})
	}
}

// An Acquire's holder id is fixed when the call
// starts (newCall). When the value's holding ends while the call waits (a
// full Release that failed: its permits stay counted in Redis until their
// lease ends), the call's grant is added to that old record and the value
// makes it its new holding, under the old id: the watchdog renews the old
// permits along with the new ones, for good.
func TestSemaphoreQueuedAcquireDoesNotReviveReleasedPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	rdbX := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close(); _ = rdbX.Close() })
	hook := &failOnce{}
	addHook(rdb, hook)
	c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond), WithRecheck(time.Hour))
	cx := newClient(t, rdbX)
	s, x := must(c.NewSemaphore("s", 2)), must(cx.NewSemaphore("s", 2))
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
	other := must(cx.NewSemaphore("s", 2))
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
	addHook(rdb, hook)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	s, x, y := must(c.NewSemaphore("s", 3)), must(c.NewSemaphore("s", 3)), must(c.NewSemaphore("s", 3))
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
	stale := func() (int64, error) { return s.release(ctx, rdb, id, partial, 1, 2, "release", "", false) }
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

// capture is a go-redis hook that records the arguments of the next
// EVALSHA of a script, so that a test can deliver an identical copy of it
// later (a copy held up on a stalled connection while go-redis's retry of
// it went through).
type capture struct {
	passHooks
	mu   sync.Mutex
	sha  string
	args []any
}

func (h *capture) arm(s *luaScript) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.args = s.Hash(), nil
}

func (h *capture) copyOf(t *testing.T) []any {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.args == nil {
		t.Fatal("nothing captured")
	}
	return append([]any(nil), h.args...)
}

func (h *capture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		if h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha {
			h.sha, h.args = "", append([]any(nil), args...)
		}
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

// failRetry makes the next EVALSHA of a script run in Redis and then fail
// the way a lost reply followed by a refused retry does. With persist set,
// the first copy runs and its reply is lost (io.EOF, which persist retries)
// and the next EVALSHA (the retry) is refused with an error reply without
// running; otherwise the one command runs and answers with the error reply
// (go-redis retried it after a lost reply, inside the command, and Redis
// refused the retry).
type failRetry struct {
	passHooks
	mu      sync.Mutex
	sha     string
	persist bool
	refuse  bool // the next EVALSHA of sha is refused
}

func (h *failRetry) arm(s *luaScript, persist bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.persist, h.refuse = s.Hash(), persist, false
}

func (h *failRetry) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		match := h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha
		refuse, persist := match && h.refuse, h.persist
		if match {
			if refuse || !persist {
				h.sha = ""
			} else {
				h.refuse = true
			}
		}
		h.mu.Unlock()
		switch {
		case !match:
			return next(ctx, cmd)
		case refuse:
			err := replyError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.")
			cmd.SetErr(err)
			return err
		case persist:
			_ = next(ctx, cmd) // it runs; the reply is lost
			cmd.SetErr(io.EOF)
			return io.EOF
		default:
			_ = next(ctx, cmd) // it runs; the retry is refused
			err := replyError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.")
			cmd.SetErr(err)
			return err
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A late copy of the first attempt of a holding (the
// call that created the holder id, sent with held = 0) is not recognised as
// stale once a full release has deleted the holder record (the record's
// call number goes with it; sem_acquire.lua does not look at the released
// memory). When an Acquire of the same value is queued onto that holding
// and the copy finds room for it (another holder's lease ran out), the
// copy's sem_serve grants the queued call (record "2:3"), and then the copy
// grants itself with the permits it read before serving: sem_put(holder,
// mine + n, seq) with mine = 0 overwrites the record with "1:1", dropping
// the grant and setting the call number back. The queued Acquire then
// finds 1 permit, rotates, and is granted 2 on top: Redis counts 3 under
// the value's holding, the value holds 2, and the watchdog renews all 3
// for as long as the holding lasts.
func TestSemaphoreStaleFirstAttemptKeepsGrantToQueuedCall(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &capture{}
	addHook(rdb, hook)
	// A copy unknown to the Client: one that rdb's retries resent.
	c := newSharedClient(t, rdb, WithRecheck(time.Hour))
	s, x := must(c.NewSemaphore("s", 3)), must(c.NewSemaphore("s", 3))
	if err := x.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// s's first call creates its holding; a copy of it is held up.
	hook.arm(semAcquireScript)
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	late := hook.copyOf(t)
	// An Acquire of 2 onto that holding queues (3 in use).
	done := acquireAsync(ctx, s, 2)
	eventually(t, 5*time.Second, "s's Acquire to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	// s gives back its 1: the holding ends (confirmed), and the queued
	// call, for 2 while x holds 2 of 3, stays queued.
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if queueLen(t, mr) != 1 {
		t.Fatal("the queued Acquire was served by the release")
	}
	// x's lease runs out (its process died): the next script reclaims it.
	if _, err := mr.ZAdd(semKey+":expiry", 1, x.holdID()); err != nil {
		t.Fatal(err)
	}
	// The late copy of s's first attempt arrives; then another value's
	// call reclaims x's permits and serves the queue.
	if err := rdb.Do(ctx, late...).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := must(c.NewSemaphore("s", 3)).TryAcquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if got := permitsOf(mr, s); s.Held() != 2 || got != "2" {
		t.Fatalf("s holds %d, Redis counts %s permits under its holding (renewed by the watchdog); want 2 and 2", s.Held(), got)
	}
}

// Settled takes an error reply to a partial release
// for "Redis refused the script: it did not run", and s keeps counting the
// permits. But the release is sent again while its reply is lost (persist,
// and go-redis's own retries): the first copy ran, and only the retry was
// refused (BUSY, OOM, ...). Redis counts 2 under the holding, s believes 3
// and renews 2; the freed permit goes to another holder: 4 of 3 permits
// are believed held.
func TestSemaphoreRefusedRetryOfPartialReleaseCountsRight(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &failRetry{}
	addHook(rdb, hook)
	c := newClient(t, rdb)
	s, x := must(c.NewSemaphore("s", 3)), must(c.NewSemaphore("s", 3))
	if err := s.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// Loaded, as after any earlier release (EVALSHA runs it at once).
	if err := semReleaseScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	hook.arm(semReleaseScript, true)
	err := s.Release(ctx, 1)
	t.Logf("Release(1): %v", err)
	ok, terr := x.TryAcquire(ctx, 1)
	t.Logf("s %d (Redis %s), x %v %d", s.Held(), permitsOf(mr, s), ok, x.Held())
	if terr != nil {
		t.Fatal(terr)
	}
	if held := s.Held() + x.Held(); held > 3 {
		t.Fatalf("s holds %d (Redis counts %s under it), x holds %d: %d of 3 permits believed held (TryAcquire: %v)",
			s.Held(), permitsOf(mr, s), x.Held(), held, ok)
	}
	if got := permitsOf(mr, s); s.Held() > 0 && got != "3" && !isClosed(s.Lost()) {
		t.Fatalf("s holds %d with Lost open, Redis counts %s", s.Held(), got)
	}
}

// The same for an attempt. A TryAcquire onto a
// holding whose script ran (and granted) but whose reply is an error reply
// (a refused retry) counts as not sent (roundtrip.MayHaveRun is false for a reply),
// so nothing is withdrawn: Redis counts n more permits under the value's
// holding than the value, and the watchdog renews them with the rest.
func TestSemaphoreRefusedRetryOfTryAcquireLeaksNoPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &failRetry{}
	addHook(rdb, hook)
	c := newClient(t, rdb)
	s := must(c.NewSemaphore("s", 3))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	hook.arm(semAcquireScript, false)
	ok, err := s.TryAcquire(ctx, 1)
	t.Logf("TryAcquire(1): %v, %v", ok, err)
	// The clean-up of a failed call, if any, runs under s's turn to talk
	// to Redis: wait for it.
	if err := s.lockOp(ctx); err != nil {
		t.Fatal(err)
	}
	s.end()
	eventually(t, 5*time.Second, "the clean-up to finish", func() bool { return c.rt.InFlight() == 0 })
	if got := permitsOf(mr, s); got != itoa(s.Held()) && (s.Lost() == notHeld || !isClosed(s.Lost())) {
		t.Fatalf("s holds %d with Lost open; Redis counts %s under its holding, renewed by the watchdog", s.Held(), got)
	}
}

// lostReplyAt makes the skip+1-th EVALSHA of a script (after arming) run
// in Redis and then fail with io.EOF: its reply was lost and go-redis's
// own retries did not get through (a network error, which a waiting call
// takes for Redis being away for a while, and attempts again).
type lostReplyAt struct {
	passHooks
	mu   sync.Mutex
	sha  string
	skip int
	hit  chan struct{}
}

func (h *lostReplyAt) arm(s *luaScript, skip int) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.skip, h.hit = s.Hash(), skip, make(chan struct{})
	return h.hit
}

func (h *lostReplyAt) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		fire := false
		if h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha {
			if h.skip == 0 {
				fire, h.sha = true, ""
			} else {
				h.skip--
			}
		}
		hit := h.hit
		h.mu.Unlock()
		if !fire {
			return next(ctx, cmd)
		}
		_ = next(ctx, cmd) // it runs; the reply is lost
		cmd.SetErr(io.EOF)
		close(hit)
		return io.EOF
	}
}

// A waiting Acquire that is not queued (its waiter id
// was dropped and it goes on under a new one: the -3/-4 path, or a grant
// given back) attempts without ARGV[9]. When such an attempt is granted
// directly and its reply is lost (a network error: transient), block
// attempts again as the same call with a higher call number; Redis finds
// the holder's record with a lower number, takes it for an older call of
// the holding, and grants n more on top. Redis counts 2 under the holding,
// s believes 1, and the watchdog renews both (a permit nobody can count
// is kept from other holders for as long as the holding lasts).
func TestSemaphoreRetriedUnqueuedAttemptGrantsOnce(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &lostReplyAt{}
	addHook(rdb, hook)
	c := newClient(t, rdb, WithWaiterTimeout(30*time.Millisecond), WithRecheck(time.Hour))
	x, s := must(c.NewSemaphore("s", 2)), must(c.NewSemaphore("s", 2))
	if err := x.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, s, 1)
	eventually(t, 5*time.Second, "s's Acquire to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	// x's lease ran out (its process died); s's waiter was dropped as
	// dead (its heartbeats stalled). The heartbeat finds it dequeued and
	// nudges it: that attempt (ARGV[9] = 1) finds it neither queued nor
	// granted (-4) and s goes on under a new waiter id, not queued. The
	// attempt after it is granted directly, and its reply is lost.
	hit := hook.arm(semAcquireScript, 1)
	// Both at once: s's heartbeat would otherwise find x's permits free
	// in between, and s would be granted before it is dropped (seen under
	// load).
	dropAsDead(t, mr, queuedWaiter(t, mr), func(p redis.Pipeliner) {
		p.ZAdd(ctx, semKey+":expiry", redis.Z{Score: 1, Member: x.holdID()})
	})
	select {
	case <-hit:
	case <-time.After(5 * time.Second):
		t.Fatal("the attempt after -4 was not sent")
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if got := permitsOf(mr, s); got != itoa(s.Held()) && (s.Lost() == notHeld || !isClosed(s.Lost())) {
		t.Fatalf("s holds %d with Lost open; Redis counts %s under its holding, renewed by the watchdog", s.Held(), got)
	}
}

// betweenCopies runs the next EVALSHA of a script twice, as go-redis does
// when it retries after a lost reply, and runs f in between (another
// process's call that lands between the two copies).
type betweenCopies struct {
	passHooks
	mu  sync.Mutex
	sha string
	f   func()
}

func (h *betweenCopies) arm(s *luaScript, f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.f = s.Hash(), f
}

func (h *betweenCopies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		var f func()
		if h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha {
			h.sha, f = "", h.f
		}
		h.mu.Unlock()
		if f == nil {
			return next(ctx, cmd)
		}
		_ = next(ctx, cmd) // it runs; the reply is lost
		f()
		return next(ctx, cmd) // go-redis's retry
	}
}

// Sem_acquire.lua compares the sizes before it looks
// for a retry of a call that was applied. An Acquire that adds to a
// holding is granted, its reply is lost, and a resize lands before
// go-redis's retry of the identical EVALSHA: the retry answers -2, Acquire
// returns ErrSizeMismatch, and nothing gives the grant back (the call was
// not queued, and the reply was not an error). Redis counts n permits more
// under the holding than s does, and the watchdog renews them with the
// rest for as long as the holding lasts: permits nobody can release.
func TestSemaphoreRetriedAcquireAcrossResizeLeavesNoPhantomPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &betweenCopies{}
	addHook(rdb, hook)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	s := must(c.NewSemaphore("s", 3))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	hook.arm(semAcquireScript, func() {
		if err := c.ResizeSemaphore(ctx, "s", 3, 4); err != nil {
			t.Error(err)
		}
	})
	// The retry is known as one, and the Acquire succeeds: its grant was
	// made before the resize.
	err := s.Acquire(ctx, 1)
	if err != nil || s.Held() != 2 {
		t.Fatalf("Acquire across the resize: %v, holding %d; want nil, 2", err, s.Held())
	}
	if got := permitsOf(mr, s); got != itoa(s.Held()) && (s.Lost() == notHeld || !isClosed(s.Lost())) {
		t.Fatalf("Acquire returned %v; s holds %d with Lost open, Redis counts %s under its holding, renewed by the watchdog", err, s.Held(), got)
	}
}
