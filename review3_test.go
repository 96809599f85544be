package redisync

import (
	"context"
	"errors"
	"strings"
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
	c := newClient(t, rdb, WithWatchdogLease(30*time.Millisecond))
	s := c.NewSemaphore("s", 2)

	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
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
	waiter := mustHKeys(t, mr, semKey+":waiters")[0]
	if _, err := mr.ZRem(semKey+":queue", waiter); err != nil {
		t.Fatal(err)
	}
	mr.HDel(semKey+":waiters", waiter)
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
	c := New(rdb)
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
