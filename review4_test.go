package redisync

import (
	"context"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// capture is a go-redis hook that records the arguments of the next
// EVALSHA of a script, so that a test can deliver an identical copy of it
// later (a copy held up on a stalled connection while go-redis's retry of
// it went through).
type capture struct {
	mu   sync.Mutex
	sha  string
	args []any
}

func (h *capture) arm(s *redis.Script) {
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

func (h *capture) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *capture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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

// Review 4, finding 1: a late copy of the first attempt of a holding (the
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
func TestReview4StaleFirstAttemptOverwritesGrantToQueuedCall(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &capture{}
	rdb.AddHook(hook)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	s, x := c.NewSemaphore("s", 3), c.NewSemaphore("s", 3)
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
	if _, err := c.NewSemaphore("s", 3).TryAcquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if got := permitsOf(mr, s); s.Held() != 2 || got != "2" {
		t.Fatalf("s holds %d, Redis counts %s permits under its holding (renewed by the watchdog); want 2 and 2", s.Held(), got)
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
	mu      sync.Mutex
	sha     string
	persist bool
	refuse  bool // the next EVALSHA of sha is refused
}

func (h *failRetry) arm(s *redis.Script, persist bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.persist, h.refuse = s.Hash(), persist, false
}

func (h *failRetry) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failRetry) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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

// Review 4, finding 2: settled takes an error reply to a partial release
// for "Redis refused the script: it did not run", and s keeps counting the
// permits. But the release is sent again while its reply is lost (persist,
// and go-redis's own retries): the first copy ran, and only the retry was
// refused (BUSY, OOM, ...). Redis counts 2 under the holding, s believes 3
// and renews 2; the freed permit goes to another holder: 4 of 3 permits
// are believed held.
func TestReview4RefusedRetryOfPartialReleaseOvercounts(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &failRetry{}
	rdb.AddHook(hook)
	c := newClient(t, rdb)
	s, x := c.NewSemaphore("s", 3), c.NewSemaphore("s", 3)
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

// Review 4, finding 2b: the same for an attempt. A TryAcquire onto a
// holding whose script ran (and granted) but whose reply is an error reply
// (a refused retry) counts as not sent (mayHaveRun is false for a reply),
// so nothing is withdrawn: Redis counts n more permits under the value's
// holding than the value, and the watchdog renews them with the rest.
func TestReview4RefusedRetryOfTryAcquireLeaksRenewedPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &failRetry{}
	rdb.AddHook(hook)
	c := newClient(t, rdb)
	s := c.NewSemaphore("s", 3)
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
	eventually(t, 5*time.Second, "the clean-up to finish", func() bool {
		c.calls.mu.Lock()
		defer c.calls.mu.Unlock()
		return c.calls.n == 0
	})
	if got := permitsOf(mr, s); got != itoa(s.Held()) && !isClosed(s.Lost()) {
		t.Fatalf("s holds %d with Lost open; Redis counts %s under its holding, renewed by the watchdog", s.Held(), got)
	}
}

func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
