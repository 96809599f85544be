package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/fairness"
	"github.com/redisync/redisync/internal/redistest"
)

// queueLen returns the number of fair waiters queued on a lock.
func queueLen(t *testing.T, rdb redis.UniversalClient, name string) int64 {
	t.Helper()
	return waitingLen(t, rdb, lockKey(name))
}

// order records the order in which waiters acquired a lock.
type order struct {
	mu  sync.Mutex
	ids []int
}

func (o *order) add(id int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ids = append(o.ids, id)
}

func (o *order) get() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.ids)
}

// queueWaiter starts a goroutine that takes m (recording id in o once it
// holds it) and releases it at once, waits until it is queued as the
// queued-th waiter, and returns a channel with Lock's error.
func queueWaiter(t *testing.T, rdb redis.UniversalClient, name string, m *redisync.Mutex, lctx context.Context, id int, o *order, queued int64) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		err := m.Lock(lctx)
		if err == nil {
			o.add(id)
			err = m.Unlock(ctx)
		}
		done <- err
	}()
	eventually(t, 5*time.Second, "the waiter to be queued", func() bool {
		return queueLen(t, rdb, name) == queued
	})
	return done
}

// assertClean fails unless a lock has no holder, queue or waiter records.
// The lock's hash stays (a release leaves it, with no owner), and so may
// tombstones of calls that withdrew with a send in flight (lockLeftovers).
// The hash may keep a Client's liveness deadline until that Client's
// watchdog removes it, in its next round after its last waiter left.
func assertClean(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Helper()
	if left := lockLeftovers(t, rdb, lockKey(name)); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}
	if st, _ := lockStateOn(t, rdb, lockKey(name)); st.Queue != 0 {
		t.Errorf("the lock's hash counts %d queued records, want 0", st.Queue)
	}
	eventually(t, 5*time.Second, "the Clients' liveness deadlines to go", func() bool {
		st, _ := lockStateOn(t, rdb, lockKey(name))
		return len(st.Clients) == 0
	})
}

func TestFairStrictArrivalOrder(t *testing.T) {
	cs := newClients(t, 4)
	rdb := admin(t)
	name := redistest.Name(t)
	holder := must(cs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var o order
	var dones []<-chan error
	const n = 20
	for i := range n {
		// Clients in a scrambled order, so that arrival order is not
		// per-Client order.
		m := must(cs[(i*3)%4].NewMutex(name))
		dones = append(dones, queueWaiter(t, rdb, name, m, ctx, i, &o, int64(i+1)))
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range dones {
		if err := <-d; err != nil {
			t.Fatal(err)
		}
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	if got := o.get(); !slices.Equal(got, want) {
		t.Fatalf("acquisition order %v, want arrival order %v", got, want)
	}
	assertClean(t, rdb, name)
}

func TestFairDeadWaiterIsSkipped(t *testing.T) {
	const heartbeat = 500 * time.Millisecond
	opts := []redisync.Option{redisync.WithWaiterTimeout(heartbeat)}
	cs := newClients(t, 2, opts...)
	rdb := admin(t)
	name := redistest.Name(t)

	// The dying waiter's Client has a go-redis client of its own, closed
	// under it, so that it cannot withdraw: as if its process died.
	deadRdb := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	dying, err := redisync.New(deadRdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dying.Close() })

	holder := must(cs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var o order
	first := queueWaiter(t, rdb, name, must(cs[1].NewMutex(name)), ctx, 0, &o, 1)
	dead := queueWaiter(t, rdb, name, must(dying.NewMutex(name)), ctx, 1, &o, 2)
	last := queueWaiter(t, rdb, name, must(cs[1].NewMutex(name)), ctx, 2, &o, 3)
	_ = deadRdb.Close()
	_ = dying.Close()
	if err := <-dead; err == nil {
		t.Fatal("the dead waiter's Lock succeeded")
	}
	if queueLen(t, rdb, name) != 3 {
		t.Fatal("the dead waiter withdrew; the test needs it to stay queued")
	}

	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []<-chan error{first, last} {
		if err := <-d; err != nil {
			t.Fatal(err)
		}
	}
	// The dead waiter is either skipped (its heartbeat ran out) or handed
	// the lock, which then runs out after the hand-off lease (the
	// heartbeat) and is noticed within a third of it.
	if gap := time.Since(released); gap > 2*heartbeat+500*time.Millisecond {
		t.Fatalf("the waiter behind a dead one got the lock %v after the release, want <= %v", gap, 2*heartbeat+500*time.Millisecond)
	}
	if got := o.get(); !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("acquisition order %v, want [0 2]", got)
	}
	eventually(t, 5*time.Second, "the lock to be free and its queue empty", func() bool {
		return len(lockLeftovers(t, rdb, lockKey(name))) == 0
	})
}

func TestFairLongWaitIsNotEvicted(t *testing.T) {
	const heartbeat = 150 * time.Millisecond
	cs := newClients(t, 2, redisync.WithWaiterTimeout(heartbeat))
	rdb := admin(t)
	name := redistest.Name(t)
	holder := must(cs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var o order
	first := queueWaiter(t, rdb, name, must(cs[1].NewMutex(name)), ctx, 0, &o, 1)
	second := queueWaiter(t, rdb, name, must(cs[0].NewMutex(name)), ctx, 1, &o, 2)
	// Hold the lock for 20 heartbeat timeouts: a waiter kept alive by its
	// heartbeats must keep its place all along.
	deadline := time.Now().Add(20 * heartbeat)
	for time.Now().Before(deadline) {
		if n := queueLen(t, rdb, name); n != 2 {
			t.Fatalf("%d waiters queued while the lock was held, want 2", n)
		}
		time.Sleep(heartbeat / 3) // sampling interval, not a wait for a condition
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []<-chan error{first, second} {
		if err := <-d; err != nil {
			t.Fatal(err)
		}
	}
	if got := o.get(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("acquisition order %v, want [0 1]", got)
	}
	assertClean(t, rdb, name)
}

func TestFairCancelInTheMiddle(t *testing.T) {
	cs := newClients(t, 3)
	rdb := admin(t)
	name := redistest.Name(t)
	holder := must(cs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var o order
	var dones []<-chan error
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range 6 {
		lctx := ctx
		if i == 2 {
			lctx = cctx
		}
		dones = append(dones, queueWaiter(t, rdb, name, must(cs[i%3].NewMutex(name)), lctx, i, &o, int64(i+1)))
	}
	cancel()
	if err := <-dones[2]; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want context.Canceled", err)
	}
	eventually(t, 5*time.Second, "the cancelled waiter to leave the queue", func() bool {
		return queueLen(t, rdb, name) == 5
	})
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i, d := range dones {
		if i == 2 {
			continue
		}
		if err := <-d; err != nil {
			t.Fatal(err)
		}
	}
	if got := o.get(); !slices.Equal(got, []int{0, 1, 3, 4, 5}) {
		t.Fatalf("acquisition order %v, want [0 1 3 4 5]", got)
	}
	assertClean(t, rdb, name)
}

func TestFairCancelRacingHandOff(t *testing.T) {
	cs := newClients(t, 2)
	rdb := admin(t)
	name := redistest.Name(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var handed, cancelled int
	for range 30 {
		holder := must(cs[0].NewMutex(name))
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		var o order
		cctx, cancel := context.WithCancel(ctx)
		racer := queueWaiter(t, rdb, name, must(cs[1].NewMutex(name)), cctx, 0, &o, 1)
		next := queueWaiter(t, rdb, name, must(cs[0].NewMutex(name)), ctx, 1, &o, 2)
		// Cancel and release at nearly the same moment, in either order.
		delay := time.Duration(rng.IntN(300)) * time.Microsecond
		go func() {
			time.Sleep(delay)
			cancel()
		}()
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		switch err := <-racer; {
		case err == nil:
			handed++
		case errors.Is(err, context.Canceled):
			cancelled++
		default:
			t.Fatal(err)
		}
		if err := <-next; err != nil {
			t.Fatal(err)
		}
		cancel()
		if got := o.get(); got[len(got)-1] != 1 {
			t.Fatalf("acquisition order %v: the waiter behind the racer must come last", got)
		}
		assertClean(t, rdb, name)
	}
	t.Logf("30 races: %d won by the hand-off, %d by the cancellation", handed, cancelled)
}

func TestFairContentionIsFairAndExclusive(t *testing.T) {
	cs := newClients(t, 4)
	const workers = 32
	res := contend(t, mutexes(cs, redistest.Name(t), workers), time.Millisecond, until(time.Now().Add(3*time.Second)))
	jain := fairness.Jain(res.counts)
	t.Logf("per goroutine %v acquisitions in 3 s, Jain index %.4f", res.counts, jain)
	if !(jain >= 0.99) {
		t.Fatalf("Jain fairness index %.4f, want >= 0.99", jain)
	}
}

func TestFairAndPlainOnOneNameStayExclusive(t *testing.T) {
	cs := newClients(t, 4)
	name := redistest.Name(t)
	fair, plain := mutexes(cs, name, 8), mutexes(cs, name, 8, redisync.Barging())
	contend(t, append(fair, plain...), 100*time.Microsecond, rounds(20))
}
