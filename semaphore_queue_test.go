package redisync

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

// queueLen returns how many waiters are queued in Redis.
func queueLen(t *testing.T, mr *miniredis.Miniredis) int {
	t.Helper()
	if !mr.Exists(semKey + ":queue") {
		return 0
	}
	m, err := mr.ZMembers(semKey + ":queue")
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// queuedWaiter returns the id of the one waiter queued on the test
// semaphore.
func queuedWaiter(t *testing.T, mr *miniredis.Miniredis) string {
	t.Helper()
	m, err := mr.ZMembers(semKey + ":queue")
	if err != nil || len(m) != 1 {
		t.Fatalf("queue: %v, %v; want one waiter", m, err)
	}
	return m[0]
}

// dropAsDead takes waiter out of the test semaphore's queue as a release
// does with a waiter found dead: its record goes, and its Client's
// deadline has passed. It does so in one transaction, with also (if any),
// so that the waiter's heartbeat, every few ms, sees all of it or none.
func dropAsDead(t *testing.T, mr *miniredis.Miniredis, waiter string, also ...func(redis.Pipeliner)) {
	t.Helper()
	ownDeadlinePassed(t, mr, semKey, waiter)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, semKey+":queue", waiter)
		p.HDel(ctx, semKey, waiter)
		p.HSet(ctx, semKey, schema.ClientField(waiter), "1")
		for _, f := range also {
			f(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ownDeadlinePassed waits until the own deadline in waiter's record in the
// waiters hash key has passed: a script drops a waiter as dead only then
// (and when its Client's deadline has passed too), and a heartbeat that
// finds its Client's deadline passed nudges only the waiters whose own
// deadline may have.
func ownDeadlinePassed(t *testing.T, mr *miniredis.Miniredis, key, waiter string) {
	t.Helper()
	rec := mr.HGet(key, waiter)
	ms, err := strconv.ParseInt(strings.SplitN(rec, ":", 2)[0], 10, 64)
	if err != nil {
		t.Fatalf("the record of %s: %q: %v", waiter, rec, err)
	}
	eventually(t, 5*time.Second, "the waiter's own deadline to pass", func() bool {
		return time.Now().UnixMilli() > ms
	})
}

func TestSemaphoreFIFONoOvertaking(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	holders := []*Semaphore{must(c.NewSemaphore("s", 3)), must(c.NewSemaphore("s", 3))}
	if err := holders[0].Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := holders[1].Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	big := must(c.NewSemaphore("s", 3))
	bigDone := acquireAsync(ctx, big, 3)
	eventually(t, 5*time.Second, "the 3-permit waiter to queue", func() bool { return queueLen(t, mr) == 1 })

	// One permit comes free: a later 1-permit request would fit, but must
	// not overtake the waiter for 3.
	if err := holders[1].Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	small := must(c.NewSemaphore("s", 3))
	if ok, err := small.TryAcquire(ctx, 1); ok || err != nil {
		t.Fatalf("TryAcquire(1) ahead of a queued waiter: %v, %v, want false", ok, err)
	}
	smallDone := acquireAsync(ctx, small, 1)
	eventually(t, 5*time.Second, "the 1-permit waiter to queue", func() bool { return queueLen(t, mr) == 2 })
	select {
	case err := <-smallDone:
		t.Fatalf("the 1-permit Acquire overtook the waiter for 3: %v", err)
	default:
	}

	if err := holders[0].Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := result(t, bigDone); err != nil || big.Held() != 3 {
		t.Fatalf("waiter for 3: %v, held %d", err, big.Held())
	}
	select {
	case err := <-smallDone:
		t.Fatalf("the 1-permit Acquire returned while 3 of 3 are held: %v", err)
	default:
	}
	if err := big.Release(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := result(t, smallDone); err != nil || small.Held() != 1 {
		t.Fatalf("waiter for 1: %v, held %d", err, small.Held())
	}
	if err := small.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreReleaseGrantsSeveralWaitersInOneMessage(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	holder := must(c.NewSemaphore("s", 4))
	// A first cycle loads the scripts, so that the count below has no
	// EVALSHA answered NOSCRIPT in it.
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := holder.Acquire(ctx, 4); err != nil {
		t.Fatal(err)
	}
	var ws []*Semaphore
	var dones []<-chan error
	for i := range 3 {
		w := must(c.NewSemaphore("s", 4))
		ws = append(ws, w)
		dones = append(dones, acquireAsync(ctx, w, int64(i+1))) // 1, 2, 3
		eventually(t, 5*time.Second, "a waiter to queue and sleep", func() bool { return queueLen(t, mr) == i+1 && asleep(c) == i+1 })
	}
	before := cnt.n.Load()
	if err := holder.Release(ctx, 4); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // 1 + 2 fit in 4, 3 does not
		if err := result(t, dones[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := cnt.n.Load() - before; n != 1 {
		t.Errorf("Release and two grants took %d commands, want 1", n)
	}
	if err := ws[0].Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := ws[1].Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := result(t, dones[2]); err != nil {
		t.Fatal(err)
	}
	if err := ws[2].Release(ctx, 3); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreDeadHeadWaiterDoesNotBlockTheQueue(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	s := must(c.NewSemaphore("s", 2))
	if ok, err := s.TryAcquire(ctx, 1); !ok || err != nil { // creates the keys
		t.Fatal(ok, err)
	}
	// A waiter for 2 from a process that died: its heartbeat deadline
	// (ms of server time) has passed.
	past := time.Now().Add(-time.Minute).UnixMilli()
	if _, err := mr.ZAdd(semKey+":queue", 1, "ghost#1"); err != nil {
		t.Fatal(err)
	}
	mr.HSet(semKey, "ghost#1", strconv.FormatInt(past, 10)+":3000:2:1")
	if ok, err := must(c.NewSemaphore("s", 2)).TryAcquire(ctx, 1); !ok || err != nil {
		t.Fatalf("TryAcquire behind a dead waiter: %v, %v, want true", ok, err)
	}
	if queueLen(t, mr) != 0 {
		t.Fatal("the dead waiter is still queued")
	}
	// A live one (deadline ahead) is respected.
	future := time.Now().Add(time.Minute).UnixMilli()
	if _, err := mr.ZAdd(semKey+":queue", 2, "alive#1"); err != nil {
		t.Fatal(err)
	}
	mr.HSet(semKey, "alive#1", strconv.FormatInt(future, 10)+":3000:2:1")
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ok, err := must(c.NewSemaphore("s", 2)).TryAcquire(ctx, 1); ok || err != nil {
		t.Fatalf("TryAcquire ahead of a live waiter: %v, %v, want false", ok, err)
	}
}

func TestSemaphoreLiveWaiterKeptByHeartbeat(t *testing.T) {
	mr, rdb, _ := newMini(t)
	const hb = 300 * time.Millisecond
	c := newClient(t, rdb, WithWaiterTimeout(hb), WithRecheck(time.Hour))
	holder, w := must(c.NewSemaphore("s", 1)), must(c.NewSemaphore("s", 1))
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, w, 1)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	field := schema.ClientField(queuedWaiter(t, mr))
	record := func() string { return mr.HGet(semKey, field) }
	// Several heartbeats pass: its Client's deadline moves each time.
	seen := map[string]bool{}
	eventually(t, 5*time.Second, "three heartbeats", func() bool {
		if v := record(); v != "" {
			seen[v] = true
		}
		return len(seen) >= 3
	})
	// Its deadline is in the past by the server clock unless renewed.
	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil || w.Held() != 1 {
		t.Fatalf("the live waiter was not served after %d heartbeats: %v", len(seen), err)
	}
	if err := w.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreGrantFoundByAttemptGetsFullLease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour)) // grant lease 3 s, lease DefaultCrashTimeout
	holder, w := must(c.NewSemaphore("s", 1)), must(c.NewSemaphore("s", 1))
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// w queues without listening, so it misses the grant's message and
	// finds the grant by attempting again, as after a lost message.
	w.turn <- struct{}{}
	a := w.newCall(1, "queue")
	if done, _, err := a.attempt(ctx); done || err != nil {
		t.Fatal(done, err)
	}
	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if done, _, err := a.attempt(ctx); !done || err != nil {
		t.Fatalf("attempt after the grant: %v, %v, want done", done, err)
	}
	exp, err := mr.ZScore(semKey+":expiry", w.holdID())
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(time.UnixMilli(int64(exp))); left < DefaultCrashTimeout-5*time.Second {
		t.Fatalf("the holder's lease ends in %v, want about %v (the watchdog renews after a third of it)", left, DefaultCrashTimeout)
	}
	if err := w.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

func TestSemaphoreWaiterDroppedAsDeadQueuesAgainWithHeartbeat(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWaiterTimeout(300*time.Millisecond), WithRecheck(time.Hour))
	holder, w := must(c.NewSemaphore("s", 1)), must(c.NewSemaphore("s", 1))
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, w, 1)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	// Dropped as if its heartbeats had stalled: the watchdog finds it gone
	// and nudges it, and it queues again.
	dropAsDead(t, mr, queuedWaiter(t, mr))
	eventually(t, 5*time.Second, "the waiter to queue again with a heartbeat", func() bool {
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
