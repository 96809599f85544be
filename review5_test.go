package redisync

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// lostReplyAt makes the skip+1-th EVALSHA of a script (after arming) run
// in Redis and then fail with io.EOF: its reply was lost and go-redis's
// own retries did not get through (a network error, which a waiting call
// takes for Redis being away for a while, and attempts again).
type lostReplyAt struct {
	mu   sync.Mutex
	sha  string
	skip int
	hit  chan struct{}
}

func (h *lostReplyAt) arm(s *redis.Script, skip int) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.skip, h.hit = s.Hash(), skip, make(chan struct{})
	return h.hit
}

func (h *lostReplyAt) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lostReplyAt) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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

// Review 5, finding 1: a waiting Acquire that is not queued (its waiter id
// was dropped and it goes on under a new one: the -3/-4 path, or a grant
// given back) attempts without ARGV[9]. When such an attempt is granted
// directly and its reply is lost (a network error: transient), block
// attempts again as the same call with a higher call number; Redis finds
// the holder's record with a lower number, takes it for an older call of
// the holding, and grants n more on top. Redis counts 2 under the holding,
// s believes 1, and the watchdog renews both (a permit nobody can count
// is kept from other holders for as long as the holding lasts).
func TestReview5RetriedUnqueuedAttemptDoublesPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &lostReplyAt{}
	rdb.AddHook(hook)
	c := newClient(t, rdb, WithHeartbeat(30*time.Millisecond), WithRecheck(time.Hour))
	x, s := c.NewSemaphore("s", 2), c.NewSemaphore("s", 2)
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
	if got := permitsOf(mr, s); got != itoa(s.Held()) && !isClosed(s.Lost()) {
		t.Fatalf("s holds %d with Lost open; Redis counts %s under its holding, renewed by the watchdog", s.Held(), got)
	}
}

// Review 5, finding 2: a semaphore's size is to live "while it is in use
// and an hour after its last Acquire", but a partial Release re-arms the
// holder's lease (sem_rearm) without the size key's TTL, and with a fixed
// lease nothing renews it. A holder that acquires with WithLease and gives
// back part of its permits late in the lease holds the rest past the size
// key's expiry; the size is then gone while the semaphore is in use, and a
// Semaphore opened with another size is accepted (ErrSizeMismatch is not
// reported) and grants beyond the size the holder was granted under.
func TestReview5PartialReleaseOutlivesSizeKey(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, rdb, WithLease(59*time.Minute))
	t0 := time.Now()
	mr.SetTime(t0)
	s := c.NewSemaphore("s", 2)
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// 58 minutes on (server clock and TTLs), s gives back 1 of its 2: its
	// lease starts anew for 59 minutes.
	mr.SetTime(t0.Add(58 * time.Minute))
	mr.FastForward(58 * time.Minute)
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// 3 minutes later s still holds 1 permit in Redis (lease until 117 min).
	mr.SetTime(t0.Add(61 * time.Minute))
	mr.FastForward(3 * time.Minute)
	if got := permitsOf(mr, s); got != "1" || s.Held() != 1 {
		t.Fatalf("s holds %d, Redis %q; want 1 and 1", s.Held(), got)
	}
	if !mr.Exists(semKey + ":size") {
		t.Errorf("the size key expired while s holds a permit whose lease ends in 56 minutes")
	}
	other := c.NewSemaphore("s", 3)
	ok, err := other.TryAcquire(ctx, 2)
	if err == nil {
		t.Fatalf("a Semaphore of size 3 was accepted while a holder of the size-2 semaphore holds (TryAcquire(2): %v): %d + %d permits of 2 held", ok, s.Held(), other.Held())
	}
}

// Review 5, finding 3: a late copy of a Lock's acquire (held up on a
// stalled connection while go-redis's retry of it went through) that
// arrives after the hold was released takes the lock again under the
// released ticket: release.lua's mode "release" does not retire the
// ticket, as the semaphore's full release now does. Nobody holds that
// hold, nobody renews or releases it, and the lock stays taken for a whole
// lease (30 s by default) after Unlock: an acquire applied twice.
func TestReview5LateAcquireCopyAfterUnlockTakesTheLock(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &capture{}
	rdb.AddHook(hook)
	c := newClient(t, rdb)
	m, other := c.NewMutex("l"), c.NewMutex("l")
	hook.arm(acquireScript)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	late := hook.copyOf(t)
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, late...).Err(); err != nil {
		t.Fatal(err)
	}
	ok, err := other.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		pttl := mr.TTL("redisync:lock:{l}")
		t.Fatalf("the lock is taken after its only holder unlocked: a late copy of the released call's acquire holds it (TTL %v), for nobody", pttl)
	}
}
