package redisync

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

const semKey = "redisync:sem:{s}"

// permitsOf returns the permits a holder has in Redis.
func permitsOf(mr *miniredis.Miniredis, s *Semaphore) string {
	v := mr.HGet(semKey, s.holdID())
	p, _, _ := strings.Cut(v, ":")
	return p
}

// asleep returns how many Acquire calls of c are queued and asleep: their
// heartbeat is registered with the watchdog just before they sleep.
func asleep(c *Client) int {
	n, _ := c.wd.Sleepers()
	return n
}

// result waits for an error from done, failing the test after 5 s.
func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for Acquire to return")
		return nil
	}
}

// acquireAsync runs s.Acquire(ctx, n) in a goroutine.
func acquireAsync(ctx context.Context, s *Semaphore, n int64) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Acquire(ctx, n) }()
	return done
}

func TestSemaphoreInvalidInputFailsBeforeRedis(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	checkInvalid(t, errOf(c.NewSemaphore("", 3)), ErrInvalidName)
	checkInvalid(t, errOf(c.NewSemaphore("}s", 3)), ErrInvalidName)
	checkInvalid(t, errOf(c.NewSemaphore("s", 0)), ErrInvalidPermits)
	checkInvalid(t, errOf(c.NewSemaphore("s", -2)), ErrInvalidPermits)
	checkInvalid(t, errOf(c.NewSemaphore("s", 3, WithFixedLease(0))), ErrInvalidOption)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	cases := []struct {
		name string
		s    *Semaphore
		n    int64
		ctx  context.Context
		want error
	}{
		{"zero permits", must(c.NewSemaphore("s", 3)), 0, ctx, ErrInvalidPermits},
		{"negative permits", must(c.NewSemaphore("s", 3)), -1, ctx, ErrInvalidPermits},
		{"cancelled context", must(c.NewSemaphore("s", 3)), 1, cancelled, context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.s.Acquire(tc.ctx, tc.n); !errors.Is(err, tc.want) {
				t.Errorf("Acquire: got %v, want %v", err, tc.want)
			}
			if ok, err := tc.s.TryAcquire(tc.ctx, tc.n); ok || !errors.Is(err, tc.want) {
				t.Errorf("TryAcquire: got %v, %v, want false, %v", ok, err, tc.want)
			}
			// Release is not refused for an ended ctx: it releases
			// what is held, here nothing.
			want := tc.want
			if want == context.Canceled {
				want = ErrTooManyReleased
			}
			if err := tc.s.Release(tc.ctx, tc.n); !errors.Is(err, want) {
				t.Errorf("Release: got %v, want %v", err, want)
			}
		})
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands reached Redis, want 0", n)
	}
}

func TestSemaphoreAcquireReleaseCounts(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	a, b := must(c.NewSemaphore("s", 5)), must(c.NewSemaphore("s", 5))
	if err := a.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := a.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if a.Held() != 3 || permitsOf(mr, a) != "3" {
		t.Fatalf("a holds %d (Redis: %q), want 3", a.Held(), permitsOf(mr, a))
	}
	if a.Lost() == notHeld {
		t.Fatal("Lost is the closed channel of no hold while permits are held")
	}
	if ok, err := b.TryAcquire(ctx, 3); ok || err != nil {
		t.Fatalf("TryAcquire(3) with 2 free: %v, %v, want false", ok, err)
	}
	if ok, err := b.TryAcquire(ctx, 2); !ok || err != nil {
		t.Fatalf("TryAcquire(2) with 2 free: %v, %v, want true", ok, err)
	}
	if got := mr.HGet(semKey, "{size}"); got != "5:"+strconv.Itoa(schema.SemLayout) { // size:layout
		t.Fatalf("stored size %q, want 5", got)
	}
	if err := a.Release(ctx, 2); err != nil || a.Held() != 1 || permitsOf(mr, a) != "1" {
		t.Fatalf("Release(2): %v, held %d (Redis %q), want 1", err, a.Held(), permitsOf(mr, a))
	}
	for _, s := range []*Semaphore{a, b} {
		if err := s.Release(ctx, s.Held()); err != nil {
			t.Fatal(err)
		}
	}
	if len(holderFields(t, mr, semKey)) != 0 || a.Lost() != notHeld || a.Held() != 0 {
		t.Fatal("permits left after releasing everything")
	}
}

// A value made with another size than the stored one works with the
// stored size, and refuses more permits than it before writing anything.
func TestSemaphoreSizeMismatch(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	if ok, err := must(c.NewSemaphore("s", 3)).TryAcquire(ctx, 1); !ok || err != nil {
		t.Fatal(ok, err)
	}
	other := must(c.NewSemaphore("s", 4))
	if err := other.Acquire(ctx, 4); !errors.Is(err, ErrInvalidPermits) {
		t.Fatalf("Acquire of more than the stored size: %v, want ErrInvalidPermits", err)
	}
	if ok, err := other.TryAcquire(ctx, 4); ok || !errors.Is(err, ErrInvalidPermits) {
		t.Fatalf("TryAcquire of more than the stored size: %v, %v, want ErrInvalidPermits", ok, err)
	}
	if other.Size() != 3 {
		t.Fatalf("Size = %d, want the stored 3", other.Size())
	}
	if got := mr.HGet(semKey, "{size}"); got != "3:"+strconv.Itoa(schema.SemLayout) {
		t.Fatalf("stored size changed to %q", got)
	}
	if other.Held() != 0 || queueLen(t, mr) != 0 {
		t.Fatal("a mismatched Semaphore left permits or a queued waiter")
	}
}

func TestSemaphoreReleaseMoreThanHeld(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	s := must(c.NewSemaphore("s", 5))
	before := cnt.n.Load()
	if err := s.Release(ctx, 1); !errors.Is(err, ErrTooManyReleased) {
		t.Fatalf("Release with nothing held: %v, want ErrTooManyReleased", err)
	}
	if n := cnt.n.Load() - before; n != 0 {
		t.Fatalf("a rejected Release sent %d commands", n)
	}
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, 3); !errors.Is(err, ErrTooManyReleased) {
		t.Fatalf("Release(3) holding 2: %v, want ErrTooManyReleased", err)
	}
	if s.Held() != 2 || permitsOf(mr, s) != "2" {
		t.Fatal("a rejected Release released something")
	}
	if err := s.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreWrongTypeIsAnErrorAndWritesNothing(t *testing.T) {
	for _, key := range []string{semKey, semKey + " {size}", semKey + ":queue", semKey + ":expiry"} {
		t.Run(key, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			c := newClient(t, rdb)
			if hash, field, ok := strings.Cut(key, " "); ok {
				mr.HSet(hash, field, "x") // a field of the hash that is not a size
				key = hash
			} else {
				mr.Lpush(key, "x")
			}
			s := must(c.NewSemaphore("s", 2))
			if err := s.Acquire(ctx, 1); !errors.Is(err, ErrWrongType) {
				t.Fatalf("Acquire: %v, want ErrWrongType", err)
			}
			if ok, err := s.TryAcquire(ctx, 1); ok || !errors.Is(err, ErrWrongType) {
				t.Fatalf("TryAcquire: %v, %v, want ErrWrongType", ok, err)
			}
			// The failed calls may have run (an error reply may answer a
			// retry of a copy that ran), so they were withdrawn: their ids
			// are refused for a while, which is all that may be left.
			for _, k := range mr.Keys() {
				if k != key && (k != semKey+":ended" || mr.TTL(k) <= 0) {
					t.Fatalf("keys after a failed acquire: %v, want only %s (and withdrawn ids, with a TTL)", mr.Keys(), key)
				}
			}
			if s.Held() != 0 {
				t.Fatal("a failed Acquire left permits")
			}
		})
	}
}

// A release that meets a key of the wrong type fails having written
// nothing, whichever key it is.
func TestSemaphoreReleaseMeetingWrongTypeWritesNothing(t *testing.T) {
	for _, suffix := range []string{"", ":expiry", ":queue", ":ended"} {
		t.Run(suffix, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			c := newClient(t, rdb)
			s := must(c.NewSemaphore("s", 2))
			if err := s.Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			key := semKey + suffix
			mr.Del(key)
			mr.Lpush(key, "x")
			mr.SetTTL(key, time.Minute)
			before := mr.Dump()
			if err := s.Release(ctx, 1); !errors.Is(err, ErrWrongType) {
				t.Fatalf("Release: %v, want ErrWrongType", err)
			}
			if after := mr.Dump(); after != before {
				t.Fatalf("the failed release wrote:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

func TestSemaphoreRetriedScriptsDoNotDoubleApply(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	s := must(c.NewSemaphore("s", 5))
	check := func(what, want string) {
		t.Helper()
		if got := permitsOf(mr, s); got != want {
			t.Fatalf("%s: Redis has %q permits, want %q", what, got, want)
		}
	}
	cnt.armReplay(semAcquireScript)
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	check("replayed acquire", "2")
	cnt.armReplay(semAcquireScript)
	if ok, err := s.TryAcquire(ctx, 2); !ok || err != nil {
		t.Fatal(ok, err)
	}
	check("replayed try-acquire", "4")
	cnt.armReplay(semReleaseScript)
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	check("replayed partial release", "3")
	cnt.armReplay(semReleaseScript)
	if err := s.Release(ctx, 3); err != nil {
		t.Fatalf("replayed final release: %v", err)
	}
	check("replayed final release", "")
	if s.Held() != 0 {
		t.Fatalf("held %d after releasing everything", s.Held())
	}

	// A replayed release that grants a waiter grants it once.
	other := must(c.NewSemaphore("s", 5))
	if err := s.Acquire(ctx, 5); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, other, 2)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	cnt.armReplay(semReleaseScript)
	if err := s.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := strings.Cut(mr.HGet(semKey, other.holdID()), ":"); got != "2" || permitsOf(mr, s) != "3" {
		t.Fatalf("after a replayed release: waiter has %q, holder %q; want 2 and 3", got, permitsOf(mr, s))
	}
}

func TestSemaphoreCancelledAcquireLeavesNothing(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	holder, w := must(c.NewSemaphore("s", 2)), must(c.NewSemaphore("s", 2))
	if err := holder.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := acquireAsync(cctx, w, 1)
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return queueLen(t, mr) == 1 })
	cancel()
	if err := result(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
	}
	if queueLen(t, mr) != 0 || slices.ContainsFunc(mustHKeys(t, mr, semKey), func(f string) bool { return strings.Contains(f, "#") }) {
		t.Fatal("a cancelled Acquire left its place in the queue")
	}
	if w.Held() != 0 || permitsOf(mr, w) != "" {
		t.Fatal("a cancelled Acquire left permits")
	}
	// The permits it did not take are free for others.
	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ok, err := must(c.NewSemaphore("s", 2)).TryAcquire(ctx, 1); !ok || err != nil {
		t.Fatalf("TryAcquire after the cancelled waiter left: %v, %v", ok, err)
	}
}

func TestSemaphoreGrantAtCancellationIsPassedOn(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// Grant lease (the heartbeat) and recheck long: the permits must be
	// given back, not left to run out.
	c := newClient(t, rdb, WithRecheck(time.Hour), WithWaiterTimeout(time.Hour))
	holder, w, next := must(c.NewSemaphore("s", 2)), must(c.NewSemaphore("s", 2)), must(c.NewSemaphore("s", 2))
	if err := holder.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	w.turn <- struct{}{}
	a := w.newCall(2, "queue")
	// Queue w by hand, as Acquire's first attempt does, then let next queue
	// behind it.
	if done, _, err := a.attempt(cctx); done || err != nil {
		t.Fatal(done, err)
	}
	nextDone := acquireAsync(ctx, next, 2)
	eventually(t, 5*time.Second, "the second waiter to queue", func() bool { return queueLen(t, mr) == 2 })
	// The release grants w, whose Acquire is being cancelled.
	if err := holder.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	cancel()
	a.finish(cctx, context.Canceled)
	eventually(t, 5*time.Second, "the cancelled waiter's permits given back", func() bool { return permitsOf(mr, w) == "" })
	if permitsOf(mr, w) != "" {
		t.Fatalf("the cancelled waiter still has %q permits in Redis", permitsOf(mr, w))
	}
	if err := result(t, nextDone); err != nil {
		t.Fatalf("the permits granted to a cancelled waiter were not passed on: %v", err)
	}
	if w.Held() != 0 || permitsOf(mr, w) != "" || permitsOf(mr, next) != "2" {
		t.Fatalf("w holds %d (Redis %q), next %q; want 0, none, 2", w.Held(), permitsOf(mr, w), permitsOf(mr, next))
	}
	if err := next.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreExpiredHolderIsReclaimed(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	dead := must(c.NewSemaphore("s", 2, WithFixedLease(time.Minute)))
	if err := dead.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	w := must(c.NewSemaphore("s", 2))
	if ok, err := w.TryAcquire(ctx, 1); ok || err != nil {
		t.Fatal(ok, err)
	}
	// miniredis's TIME follows its own clock: move it past the lease.
	mr.SetTime(time.Now().Add(2 * time.Minute))
	if ok, err := w.TryAcquire(ctx, 2); !ok || err != nil {
		t.Fatalf("TryAcquire after the holder's lease ended: %v, %v", ok, err)
	}
	if err := dead.Release(ctx, 2); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release of expired permits: %v, want ErrLockLost", err)
	}
	if permitsOf(mr, w) != "2" {
		t.Fatal("the lost holder's Release touched another holder's permits")
	}
}

func TestSemaphoreConcurrentUseOfOneValue(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(50*time.Millisecond))
	s := must(c.NewSemaphore("s", 3))
	errs := make(chan error, 20)
	for range 20 {
		go func() {
			if err := s.Acquire(ctx, 1); err != nil {
				errs <- err
				return
			}
			errs <- s.Release(ctx, 1)
		}()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if s.Held() != 0 {
		t.Fatalf("held %d at the end", s.Held())
	}
}

func mustHKeys(t *testing.T, mr *miniredis.Miniredis, key string) []string {
	t.Helper()
	keys, err := mr.HKeys(key)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// holderFields returns the holder records' fields of the semaphore whose
// holders hash is key (none for no hash): its own fields left out.
func holderFields(t *testing.T, mr *miniredis.Miniredis, key string) []string {
	t.Helper()
	if !mr.Exists(key) {
		return nil
	}
	return slices.DeleteFunc(mustHKeys(t, mr, key), func(f string) bool { return !schema.SemHolderField(f) })
}

func TestSemaphoreLostWhenPermitsRemoved(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// The loss is seen within a third of the lease; the later holding
	// must outlive the watchdog's pauses under -race.
	c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond))
	s := must(c.NewSemaphore("s", 2))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	lost := s.Lost()
	mr.Del(semKey)
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after the holder's permits were removed")
	}
	if err := s.Acquire(ctx, 1); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Acquire after loss: %v, want ErrLockLost", err)
	}
	if err := s.Release(ctx, 1); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release after loss: %v, want ErrLockLost", err)
	}
	if s.Held() != 0 || s.Lost() != notHeld {
		t.Fatal("a lost holding is still counted after its Release")
	}
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatalf("a new holding after the loss: %v", err)
	}
	if err := s.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreReleaseWithCancelledCallIsResolved(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	s := must(c.NewSemaphore("s", 3))
	if err := s.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// The call reaches Redis, then ctx ends before the reply is read.
	for try := 1; ; try++ {
		cctx, cancel := context.WithCancel(ctx)
		addHook(rdb, &cancelAfter{cancel: cancel})
		err := s.Release(cctx, 1)
		if err == nil {
			break
		}
		// A machine that stalls past the grace after ctx's end leaves
		// the release to the background, as it should: try again.
		if try == 5 || !errors.Is(err, context.Canceled) {
			t.Fatalf("Release whose reply was lost (try %d): %v, want it resolved", try, err)
		}
		eventually(t, 5*time.Second, "the release left to the background to settle", func() bool { return c.rt.InFlight() == 0 })
		if err := s.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	if s.Held() != 2 || permitsOf(mr, s) != "2" {
		t.Fatalf("held %d, Redis %q; want 2 and 2", s.Held(), permitsOf(mr, s))
	}
}

// cancelAfter is a go-redis hook that ends a context after the first
// EVALSHA it sends has run, as if the reply was lost when it ended.
type cancelAfter struct {
	passHooks
	cancel context.CancelFunc
	done   atomic.Bool
}

func (h *cancelAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "evalsha" && h.done.CompareAndSwap(false, true) {
			h.cancel()
			return context.Canceled
		}
		return err
	}
}

func TestSemaphoreCloseEndsWaitersAndHoldings(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb, WithRecheck(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	holder, w := must(c.NewSemaphore("s", 1)), must(c.NewSemaphore("s", 1))
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, w, 1)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	lost := holder.Lost()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting Acquire after Close: %v, want ErrClosed", err)
	}
	if queueLen(t, mr) != 0 {
		t.Fatal("the waiter is still queued after Close")
	}
	select {
	case <-lost:
	default:
		t.Fatal("a holding's Lost channel is still open after Close")
	}
	if err := holder.Release(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Release after Close: %v, want ErrClosed", err)
	}
	if ok, err := w.TryAcquire(ctx, 1); ok || !errors.Is(err, ErrClosed) {
		t.Fatalf("TryAcquire after Close: %v, %v, want ErrClosed", ok, err)
	}
}
