package redisynctest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/redisynctest"
)

// within is how soon, in real time, a hold the kit ended is lost and a
// waiting Lock of another Client takes the lock.
const within = 10 * time.Millisecond

// rounds is how many times each scenario runs in a batch: every one must
// be within bounds.
const rounds = 20

// waiting returns once the lock name has n queued waiters and a
// subscriber on its channels, and a little more (the waiter's last look
// before it sleeps).
func waiting(t *testing.T, kit *redisynctest.Kit, name string, n int) {
	t.Helper()
	queue := "redisync:lock:{" + name + "}:waiting"
	deadline := time.Now().Add(5 * time.Second)
	for {
		list, _ := kit.Miniredis().List(queue)
		if len(list) >= n && len(kit.Miniredis().PubSubChannels("redisync:lock:{"+name+"}:ch:*")) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no waiter queued on %q", name)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
}

// race measures, from the return of end, the real time until holder's
// Lost closes and until waiter's pending Lock (done) returns.
func race(t *testing.T, holder *redisync.Mutex, done <-chan error, end func()) (lost, locked time.Duration) {
	t.Helper()
	lostAt := make(chan time.Time, 1)
	go func() {
		<-holder.Lost()
		lostAt <- time.Now()
	}()
	start := time.Now()
	end()
	if err := <-done; err != nil {
		t.Fatalf("the waiter's Lock: %v", err)
	}
	locked = time.Since(start)
	select {
	case at := <-lostAt:
		lost = at.Sub(start)
	case <-time.After(5 * time.Second):
		t.Fatal("the holder's Lost channel did not close")
	}
	return lost, locked
}

// lockAsync starts m.Lock in a goroutine, whose outcome it returns.
func lockAsync(ctx context.Context, m *redisync.Mutex) <-chan error {
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }()
	return done
}

func mutex(t *testing.T, c *redisync.Client, name string) *redisync.Mutex {
	t.Helper()
	m, err := c.NewMutex(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// batches is how many times a test measures its rounds while a batch has
// a round over within: a round over it by a scheduling delay of the test
// machine (the race detector, other packages' tests on 2 cores) is
// logged, and the batch runs again.
const batches = 3

// measured runs batch, which measures rounds rounds, up to batches times,
// until one batch has every round within bounds; it fails t when none
// has.
func measured(t *testing.T, what string, batch func() (lost, locked []time.Duration)) {
	t.Helper()
	for n := 1; n <= batches; n++ {
		lost, locked := batch()
		t.Logf("%s, batch %d: Lost closed after %v", what, n, lost)
		t.Logf("%s, batch %d: the waiter's Lock returned after %v", what, n, locked)
		over := 0
		for i := range lost {
			if lost[i] >= within || locked[i] >= within {
				over++
				t.Logf("%s, batch %d, round %d: Lost closed after %v, the waiter's Lock returned after %v; want both within %v",
					what, n, i, lost[i], locked[i], within)
			}
		}
		if over == 0 || t.Failed() {
			return
		}
	}
	t.Errorf("%s: each of %d batches of %d rounds had a round over %v", what, batches, rounds, within)
}

func TestEndLeaseLosesTheHoldAndLetsTheWaiterIn(t *testing.T) {
	ctx := context.Background()
	kit := redisynctest.New(t)
	a, b := kit.Client(), kit.Client()
	batch := 0
	measured(t, "EndLease", func() (lost, locked []time.Duration) {
		batch++
		for i := range rounds {
			name := fmt.Sprintf("job%d-%d", batch, i)
			holder, other := mutex(t, a, name), mutex(t, b, name)
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			done := lockAsync(ctx, other)
			waiting(t, kit, name, 1)
			l, w := race(t, holder, done, func() {
				if !kit.EndLease(name) {
					t.Error("EndLease found no hold")
				}
			})
			lost, locked = append(lost, l), append(locked, w)
			if err := holder.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
				t.Errorf("the old holder's Unlock: %v, want ErrLockLost", err)
			}
			if err := other.Unlock(ctx); err != nil {
				t.Errorf("the new holder's Unlock: %v", err)
			}
		}
		return lost, locked
	})
}

func TestKillEndsOnlyThatClientsHolds(t *testing.T) {
	ctx := context.Background()
	kit := redisynctest.New(t)
	b, bystander := kit.Client(), kit.Client()
	batch := 0
	measured(t, "Kill", func() (lost, locked []time.Duration) {
		batch++
		for i := range rounds {
			name := fmt.Sprintf("job%d-%d", batch, i)
			a := kit.Client()
			holder, other := mutex(t, a, name), mutex(t, b, name)
			kept := mutex(t, bystander, name+"-kept")
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := kept.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			done := lockAsync(ctx, other)
			waiting(t, kit, name, 1)
			l, w := race(t, holder, done, func() { kit.Kill(a) })
			lost, locked = append(lost, l), append(locked, w)
			if err := other.Unlock(ctx); err != nil {
				t.Errorf("the new holder's Unlock: %v", err)
			}
			select {
			case <-kept.Lost():
				t.Fatal("Kill of another Client lost the bystander's hold")
			default:
			}
			if err := kept.Unlock(ctx); err != nil {
				t.Errorf("the bystander's Unlock: %v", err)
			}
		}
		return lost, locked
	})
}

// TestNoFalseLoss: holds the kit did not end are kept, by Clients with
// their usual timeouts, while the kit ends other leases, kills other
// Clients and moves the clock by less than a crash timeout.
func TestNoFalseLoss(t *testing.T) {
	ctx := context.Background()
	kit := redisynctest.New(t)
	keeper := kit.Client(redisync.WithCrashTimeout(300 * time.Millisecond))
	kept := mutex(t, keeper, "kept")
	if err := kept.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(time.Second)
	for i := 0; time.Now().Before(end); i++ {
		c := kit.Client()
		m := mutex(t, c, fmt.Sprintf("other%d", i))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			kit.EndLease(m.Name())
			<-m.Lost()
		} else {
			kit.Kill(c)
		}
		kit.Advance(10 * time.Millisecond)
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-kept.Lost():
		t.Fatal("a hold the kit did not end was lost")
	default:
	}
	if err := kept.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of the kept hold: %v", err)
	}
}

// TestAdvance: a lease that Advance runs past ends in Redis; its holder
// learns of it at once, and the waiter takes the lock.
func TestAdvance(t *testing.T) {
	ctx := context.Background()
	kit := redisynctest.New(t)
	a, b := kit.Client(), kit.Client()
	holder, other := mutex(t, a, "job"), mutex(t, b, "job")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := lockAsync(ctx, other)
	waiting(t, kit, "job", 1)
	before := kit.Now()
	l, w := race(t, holder, done, func() { kit.Advance(redisync.DefaultCrashTimeout) })
	if got := kit.Now().Sub(before); got < redisync.DefaultCrashTimeout {
		t.Errorf("Now moved by %v, want at least %v", got, redisync.DefaultCrashTimeout)
	}
	t.Logf("Advance: Lost closed after %v, the waiter's Lock returned after %v", l, w)
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The clock goes on from where Advance left it.
	ttl := kit.Miniredis().TTL("redisync:lock:{job}")
	if ttl <= 0 {
		t.Fatalf("the lock's state has no TTL: %v", ttl)
	}
}

func TestEndLeaseWithNoHold(t *testing.T) {
	kit := redisynctest.New(t)
	if kit.EndLease("nothing") {
		t.Fatal("EndLease reported a hold of a lock never taken")
	}
	c := kit.Client()
	m := mutex(t, c, "free")
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if kit.EndLease("free") {
		t.Fatal("EndLease reported a hold of a free lock")
	}
}

// TestFixedLease: a hold with a fixed lease, which is never renewed, is
// lost at once too, by EndLease and by an Advance past its lease.
func TestFixedLease(t *testing.T) {
	ctx := context.Background()
	kit := redisynctest.New(t)
	a, b := kit.Client(redisync.WithFixedLease(time.Hour)), kit.Client()
	for _, end := range []struct {
		name string
		do   func(name string)
	}{
		{"EndLease", func(name string) { kit.EndLease(name) }},
		{"Advance", func(string) { kit.Advance(time.Hour) }},
	} {
		holder, other := mutex(t, a, end.name), mutex(t, b, end.name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		done := lockAsync(ctx, other)
		waiting(t, kit, end.name, 1)
		l, w := race(t, holder, done, func() { end.do(end.name) })
		t.Logf("%s of a fixed lease: Lost closed after %v, the waiter's Lock returned after %v", end.name, l, w)
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNightlyJob(t *testing.T) { testNightlyJob(t) }

// An Election's leader is a lock's holder: EndLease ends its term, and a
// waiting candidate leads.
func TestEndLeaseOfAnElection(t *testing.T) {
	ctx := context.Background()
	kit := redisynctest.New(t)
	a, b := kit.Client(), kit.Client()
	leader, err := a.NewElection("primary")
	if err != nil {
		t.Fatal(err)
	}
	candidate, err := b.NewElection("primary")
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- candidate.Campaign(ctx, "b") }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if !kit.EndLease("primary") {
		t.Fatal("EndLease found no leader")
	}
	<-leader.Lost()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("the leader lost its term, and the candidate leads, after %v", time.Since(start))
	if err := candidate.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// A killed Client's calls fail: its process is dead.
func TestKilledClientCallsFail(t *testing.T) {
	kit := redisynctest.New(t)
	c := kit.Client()
	m := mutex(t, c, "job")
	kit.Kill(c)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ok, err := m.TryLock(ctx); ok || err == nil {
		t.Fatalf("TryLock of a killed Client: %v, %v; want an error", ok, err)
	}
}

// EndLease serves a fair queue in order, and wakes barging waiters, which
// have no queue.
func TestEndLeaseServesWaitersInOrder(t *testing.T) {
	ctx := context.Background()
	kit := redisynctest.New(t)
	a, b, c := kit.Client(), kit.Client(), kit.Client()
	holder := mutex(t, a, "fair")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first, second := mutex(t, b, "fair"), mutex(t, c, "fair")
	firstDone := lockAsync(ctx, first)
	waiting(t, kit, "fair", 1)
	secondDone := lockAsync(ctx, second)
	waiting(t, kit, "fair", 2)
	kit.EndLease("fair")
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-secondDone:
		t.Fatalf("the second waiter's Lock returned (%v) while the first holds", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-secondDone; err != nil {
		t.Fatal(err)
	}
	if err := second.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	barging, err := a.NewMutex("barging", redisync.Barging())
	if err != nil {
		t.Fatal(err)
	}
	if err := barging.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := b.NewMutex("barging", redisync.Barging())
	if err != nil {
		t.Fatal(err)
	}
	done := lockAsync(ctx, other)
	time.Sleep(50 * time.Millisecond)
	l, w := race(t, barging, done, func() { kit.EndLease("barging") })
	t.Logf("barging: Lost closed after %v, the waiter's Lock returned after %v", l, w)
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
