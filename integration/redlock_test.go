package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// spawnNodes starts n redis-servers of the test's own.
func spawnNodes(t *testing.T, n int) []*redistest.Server {
	t.Helper()
	ss := make([]*redistest.Server, n)
	for i := range ss {
		s := redistest.Spawn(t)
		// Kill it before its own clean-up, and wait until it is gone, so
		// that the goroutine reaping it has ended when goleak looks.
		t.Cleanup(func() { s.Kill(t) })
		ss[i] = s
	}
	return ss
}

// newRedlocks returns k Redlocks over the servers, each with go-redis
// clients of its own (as k processes would have), closed at the end of the
// test.
func newRedlocks(t *testing.T, ss []*redistest.Server, k int, opts ...redisync.Option) []*redisync.Redlock {
	t.Helper()
	rs := make([]*redisync.Redlock, k)
	for j := range rs {
		rdbs := make([]redis.UniversalClient, len(ss))
		for i, s := range ss {
			rdbs[i] = redistest.NewClient(t, s.Addr)
		}
		r, err := redisync.NewRedlock(rdbs, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		rs[j] = r
	}
	return rs
}

// nodeAdmins returns a plain go-redis client per live server.
func nodeAdmins(t *testing.T, ss []*redistest.Server) []*redis.Client {
	t.Helper()
	out := make([]*redis.Client, len(ss))
	for i, s := range ss {
		out[i] = redistest.NewClient(t, s.Addr)
	}
	return out
}

// leftovers lists, on every reachable node, what lock name left there
// (lockLeftovers): a hold still held, or any key but the lock's hash (which
// a release leaves free, keeping the last token) and the tombstones of
// calls that withdrew with a send in flight (a node attempt that its round
// gave up on leaves one by design), which expire within an hour.
func leftovers(t *testing.T, admins []*redis.Client, name string) []string {
	t.Helper()
	var out []string
	for i, rdb := range admins {
		if rdb.Ping(ctx).Err() != nil {
			continue // a node that is down holds nothing we can see
		}
		for _, l := range lockLeftovers(t, rdb, lockKey(name)) {
			out = append(out, fmt.Sprintf("node %d: %s", i, l))
		}
	}
	return out
}

// seedToken makes node rdb's lock name, free, remember last as the last
// fencing token it issued: as if it had minted more tokens for the name
// than the other nodes.
func seedToken(t *testing.T, rdb *redis.Client, name string, last int64) {
	t.Helper()
	if err := rdb.HSet(ctx, lockKey(name), schema.LayoutField, schema.Layout, schema.TokenField, last).Err(); err != nil {
		t.Fatal(err)
	}
}

// jumpClock ends the lease of the hold of lock name on node rdb now, as a
// jump of that server's clock would: the hold runs out there, the state
// (the last token) stays.
func jumpClock(t *testing.T, rdb *redis.Client, name string) {
	t.Helper()
	if err := rdb.HSet(ctx, lockKey(name), schema.EndField, serverNow(t, rdb)).Err(); err != nil {
		t.Fatal(err)
	}
}

// contendRedlock runs workers goroutines spread over rs, each with a
// RedMutex of its own on name, rounds times each, and fails the test if two
// are ever inside at once or a token does not exceed the one before.
func contendRedlock(t *testing.T, rs []*redisync.Redlock, name string, workers, n int) {
	t.Helper()
	ls := make([]locker, workers)
	for i := range ls {
		ls[i] = must(rs[i%len(rs)].NewMutex(name))
	}
	increasing(t, contend(t, ls, 200*time.Microsecond, rounds(n)).tokens)
}

func TestRedlockExclusionUnderContention(t *testing.T) {
	ss := spawnNodes(t, 3)
	rs := newRedlocks(t, ss, 3)
	name := redistest.Name(t)
	contendRedlock(t, rs, name, 16, 10)
	if l := leftovers(t, nodeAdmins(t, ss), name); len(l) > 0 {
		t.Fatalf("keys left after every Unlock: %v", l)
	}
}

// lockEveryNode locks m so that it holds the lock on every node of ss: a
// Lock that won a bare quorum (a node slower than the node timeout, on a
// loaded machine) loses the lock when the nodes a test kills are among
// its own, which is a real loss but not what the test is about.
func lockEveryNode(t *testing.T, m *redisync.RedMutex, ss []*redistest.Server) {
	t.Helper()
	admins := nodeAdmins(t, ss)
	onEvery := func() bool {
		for _, rdb := range admins {
			if rdb.HGet(ctx, lockKey(m.Name()), schema.OwnerField).Val() == "" {
				return false
			}
		}
		return true
	}
	for try := 1; ; try++ {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if onEvery() {
			return
		}
		if try == 5 {
			t.Fatal("5 Locks in a row did not take every node")
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRedlockMinorityKilled(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprint(n, "nodes"), func(t *testing.T) {
			ss := spawnNodes(t, n)
			rs := newRedlocks(t, ss, 2, redisync.WithNodeTimeout(300*time.Millisecond))
			name := redistest.Name(t)
			a, b := must(rs[0].NewMutex(name)), must(rs[1].NewMutex(name))
			lockEveryNode(t, a, ss)
			// Kill a minority while a holds the lock: a keeps it.
			minority := (n - 1) / 2
			for _, s := range ss[:minority] {
				s.Kill(t)
			}
			if ok, err := b.TryLock(ctx); ok || err != nil {
				t.Fatalf("TryLock while held, minority down: %v, %v; want false, nil", ok, err)
			}
			select {
			case <-a.Lost():
				t.Fatal("Lost closed with a quorum of nodes alive")
			default:
			}
			if err := a.Unlock(ctx); err != nil {
				t.Fatalf("Unlock with a minority down: %v", err)
			}
			contendRedlock(t, rs, name, 8, 5)
			if l := leftovers(t, nodeAdmins(t, ss[minority:]), name); len(l) > 0 {
				t.Fatalf("keys left: %v", l)
			}
		})
	}
}

func TestRedlockMajorityDownIsErrQuorum(t *testing.T) {
	const nodeTimeout = 300 * time.Millisecond
	const bound = 3 * time.Second // node timeout, two rounds, and a loaded machine
	t.Run("killed", func(t *testing.T) {
		ss := spawnNodes(t, 3)
		rs := newRedlocks(t, ss, 1, redisync.WithNodeTimeout(nodeTimeout))
		m := must(rs[0].NewMutex(redistest.Name(t)))
		ss[0].Kill(t)
		ss[2].Kill(t)
		start := time.Now()
		err := m.Lock(ctx)
		if !errors.Is(err, redisync.ErrQuorum) || time.Since(start) > bound {
			t.Fatalf("Lock with 2 of 3 nodes killed: %v after %v; want ErrQuorum within %v", err, time.Since(start), bound)
		}
		t.Log(err)
	})
	t.Run("while waiting", func(t *testing.T) {
		const recheck = time.Second
		ss := spawnNodes(t, 3)
		rs := newRedlocks(t, ss, 2, redisync.WithNodeTimeout(nodeTimeout), redisync.WithRecheck(recheck))
		name := redistest.Name(t)
		holder, waiter := must(rs[0].NewMutex(name)), must(rs[1].NewMutex(name))
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { got <- waiter.Lock(ctx) }()
		admins := nodeAdmins(t, ss)
		grants := lockKey(name) + ":ch:*" // the waiter's Client's grant channel
		eventually(t, 5*time.Second, "the waiter subscribed on node 2", func() bool {
			return len(admins[2].PubSubChannels(ctx, grants).Val()) == 1
		})
		ss[0].Kill(t)
		ss[1].Kill(t)
		start := time.Now()
		select {
		case err := <-got:
			if !errors.Is(err, redisync.ErrQuorum) {
				t.Fatalf("waiting Lock after 2 of 3 nodes died: %v, want ErrQuorum", err)
			}
		case <-time.After(recheck + bound):
			t.Fatalf("waiting Lock still blocked %v after a majority died", recheck+bound)
		}
		t.Logf("ErrQuorum %v after the majority died", time.Since(start))
	})
	t.Run("paused", func(t *testing.T) {
		ss := spawnNodes(t, 5)
		rs := newRedlocks(t, ss, 1, redisync.WithNodeTimeout(nodeTimeout))
		name := redistest.Name(t)
		admins := nodeAdmins(t, ss)
		m := must(rs[0].NewMutex(name))
		for _, s := range ss[2:] {
			s.Signal(t, syscall.SIGSTOP)
		}
		start := time.Now()
		err := m.Lock(ctx)
		took := time.Since(start)
		for _, s := range ss[2:] {
			s.Signal(t, syscall.SIGCONT)
		}
		if !errors.Is(err, redisync.ErrQuorum) || took > bound {
			t.Fatalf("Lock with 3 of 5 nodes paused: %v after %v; want ErrQuorum within %v", err, took, bound)
		}
		// The paused nodes ran the acquire when they resumed: the
		// abandoned calls must undo it.
		eventually(t, 15*time.Second, "no orphan keys on any node", func() bool {
			return len(leftovers(t, admins, name)) == 0
		})
		// And the lock works again.
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A slow node (paused past the node timeout) does not stop the others
// from granting the lock, and the grant it makes when it resumes is undone.
func TestRedlockSlowNodeGrantIsUndone(t *testing.T) {
	ss := spawnNodes(t, 3)
	rs := newRedlocks(t, ss, 1, redisync.WithNodeTimeout(300*time.Millisecond))
	name := redistest.Name(t)
	admins := nodeAdmins(t, ss)
	m := must(rs[0].NewMutex(name))
	ss[2].Signal(t, syscall.SIGSTOP)
	err := m.Lock(ctx)
	ss[2].Signal(t, syscall.SIGCONT)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the slow node's late grant undone", func() bool {
		return !heldOn(t, admins[2], lockKey(name))
	})
	for i := range 2 {
		if !heldOn(t, admins[i], lockKey(name)) {
			t.Fatalf("node %d lost the hold", i)
		}
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, admins, name); len(l) > 0 {
		t.Fatalf("keys left: %v", l)
	}
}

// Kleppmann's scenario: a majority of the holder's node keys expire early
// (a clock jump on those servers, emulated by PEXPIRE), another client is
// granted the lock while the first still believes it holds it. Redlock
// cannot prevent that; the fencing token lets the resource reject the
// stale holder.
func TestRedlockClockJumpDoubleGrantIsFenced(t *testing.T) {
	ss := spawnNodes(t, 3)
	rs := newRedlocks(t, ss, 2)
	admins := nodeAdmins(t, ss)
	name := redistest.Name(t)
	// Node 0 has minted more tokens for this name than the others.
	seedToken(t, admins[0], name, 100)
	h1, h2 := must(rs[0].NewMutex(name)), must(rs[1].NewMutex(name))
	if err := h1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	t1 := h1.Token()
	for _, rdb := range admins[1:] {
		jumpClock(t, rdb, name)
	}
	eventually(t, 5*time.Second, "the holds on nodes 1 and 2 to expire", func() bool {
		return heldCount(t, lockKey(name), admins[1:]...) == 0
	})
	if err := h2.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	t2 := h2.Token()
	select {
	case <-h1.Lost():
		t.Fatal("h1 already knows; the scenario needs it not to")
	default:
	}
	t.Logf("double grant: h1 holds with token %d, h2 holds with token %d", t1, t2)

	var res fenced
	if err := res.write(t2, "h2"); err != nil {
		t.Fatalf("the current holder's write: %v", err)
	}
	if err := res.write(t1, "h1"); err == nil {
		t.Fatalf("the stale holder's write (token %d) was accepted after token %d", t1, t2)
	}
	if t2 <= t1 {
		t.Fatalf("token %d of the later hold is not above %d", t2, t1)
	}
	if err := h1.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
		t.Fatalf("h1's Unlock: %v, want ErrLockLost", err)
	}
	if st, now := lockStateOn(t, admins[1], lockKey(name)); !st.Held(now) || st.Token != t2 {
		t.Fatalf("h1's Unlock removed h2's hold (token %d): %+v", t2, st)
	}
	if err := h2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Kleppmann's example on 5 nodes: h1 gets A, B, C (D and E are
// unreachable for it), C's clock jumps and its key expires, and h2 gets C,
// D, E. Both hold a majority at once; C carries h1's token forward, so h2's
// token is larger.
func TestRedlockKleppmannFiveNodes(t *testing.T) {
	ss := spawnNodes(t, 5)
	rs := newRedlocks(t, ss, 2, redisync.WithNodeTimeout(300*time.Millisecond))
	admins := nodeAdmins(t, ss)
	name := redistest.Name(t)
	seedToken(t, admins[0], name, 100)
	h1, h2 := must(rs[0].NewMutex(name)), must(rs[1].NewMutex(name))
	for _, s := range ss[3:] {
		s.Signal(t, syscall.SIGSTOP)
	}
	err := h1.Lock(ctx)
	for _, s := range ss[3:] {
		s.Signal(t, syscall.SIGCONT)
	}
	if err != nil {
		t.Fatal(err)
	}
	// D and E ran h1's acquire when they resumed; it is undone.
	eventually(t, 15*time.Second, "h1's late grants on D and E undone", func() bool {
		return heldCount(t, lockKey(name), admins[3:]...) == 0
	})
	t1 := h1.Token()
	jumpClock(t, admins[2], name)
	eventually(t, 5*time.Second, "C's hold to expire", func() bool {
		return !heldOn(t, admins[2], lockKey(name))
	})
	if err := h2.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	t2 := h2.Token()
	select {
	case <-h1.Lost():
		t.Fatal("h1 already knows; the scenario needs it not to")
	default:
	}
	t.Logf("double grant on 5 nodes: h1 token %d on A,B,C; h2 token %d on C,D,E", t1, t2)
	var res fenced
	if err := res.write(t2, "h2"); err != nil {
		t.Fatal(err)
	}
	if err := res.write(t1, "h1"); err == nil {
		t.Fatalf("the stale holder's write (token %d) was accepted after token %d", t1, t2)
	}
	if err := h1.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
		t.Fatalf("h1's Unlock: %v, want ErrLockLost", err)
	}
	if err := h2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, admins, name); len(l) > 0 {
		t.Fatalf("keys left: %v", l)
	}
}

// fenced is a resource that rejects writes carrying a token lower than
// the highest it has seen.
type fenced struct {
	mu      sync.Mutex
	highest int64
}

func (f *fenced) write(token int64, who string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token < f.highest {
		return fmt.Errorf("%s: token %d is stale (seen %d)", who, token, f.highest)
	}
	f.highest = token
	return nil
}

func TestRedlockLostWhenMajorityLost(t *testing.T) {
	const lease = time.Second
	ss := spawnNodes(t, 3)
	rs := newRedlocks(t, ss, 1, redisync.WithCrashTimeout(lease), redisync.WithNodeTimeout(200*time.Millisecond))
	m := must(rs[0].NewMutex(redistest.Name(t)))
	lockEveryNode(t, m, ss)
	ss[0].Kill(t)
	// Node 0's hold is lost by its deadline (< lease); the quorum stays.
	select {
	case <-m.Lost():
		t.Fatal("Lost closed with 2 of 3 node holds alive")
	case <-time.After(2 * lease):
	}
	ss[1].Kill(t)
	start := time.Now()
	select {
	case <-m.Lost():
	case <-time.After(5 * lease):
		t.Fatal("Lost not closed after a majority of nodes went down")
	}
	if d := time.Since(start); d > lease+500*time.Millisecond {
		t.Fatalf("Lost closed %v after the majority went down, later than the lease %v", d, lease)
	}
	if err := m.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) && !errors.Is(err, redisync.ErrQuorum) {
		t.Fatalf("Unlock of a lost hold: %v", err)
	}
}

// A waiter is woken by the release on its nodes' channels, not by its
// recheck interval, and sends nothing while it sleeps: also when the
// holder holds a bare quorum, 2 of 3 nodes (the third answered after the
// quorum, or lost its hold), and every round of the waiter takes the free
// node.
func TestRedlockWaiterWokenByPubSub(t *testing.T) {
	t.Run("every node held", func(t *testing.T) { testRedlockWaiterWoken(t, false) })
	t.Run("a bare quorum held", func(t *testing.T) { testRedlockWaiterWoken(t, true) })
}

func testRedlockWaiterWoken(t *testing.T, bare bool) {
	ss := spawnNodes(t, 3)
	// A minute's lease: the holder's watchdog renews it every 20 s, never
	// inside the observation window.
	rs := newRedlocks(t, ss, 2, redisync.WithRecheck(time.Minute), redisync.WithCrashTimeout(time.Minute))
	admins := nodeAdmins(t, ss)
	name := redistest.Name(t)
	holder, waiter := must(rs[0].NewMutex(name)), must(rs[1].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if bare {
		// Leave the holder a bare quorum: take one node from it, unless
		// it holds two already (a node that answered after the quorum
		// was given back).
		var held []*redis.Client
		for _, rdb := range admins {
			if heldOn(t, rdb, lockKey(name)) {
				held = append(held, rdb)
			}
		}
		if len(held) == len(admins) {
			if err := held[1].Del(ctx, lockKey(name)).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	grants := lockKey(name) + ":ch:*" // the waiter's Client's grant channel on each node
	for i, rdb := range admins {
		eventually(t, 5*time.Second, fmt.Sprintf("node %d's subscriber", i), func() bool {
			if len(got) > 0 {
				t.Fatalf("the waiter returned while the lock was held: %v", <-got)
			}
			return len(rdb.PubSubChannels(ctx, grants).Val()) == 1
		})
	}
	// Watch the nodes for a while: a sleeping waiter sends nothing.
	counters := make([]cmdCounter, len(admins))
	before := make([]int64, len(admins))
	beforeStats := make([]map[string]int64, len(admins))
	for i, rdb := range admins {
		counters[i] = cmdCounter{rdb}
		// Settled: quiet for longer than the pause between two rounds
		// of the waiter's first attempts (after a round that took the
		// free node, it pauses up to maxSplitJitter, 50 ms).
		eventually(t, 5*time.Second, "the waiter to settle", func() bool {
			a := counters[i].total(t)
			<-time.After(100 * time.Millisecond) // a measuring interval
			b := counters[i].total(t)
			before[i] = b
			beforeStats[i] = counters[i].stats(t)
			return b-a <= 1
		})
	}
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while the lock was held: %v", err)
	case <-time.After(2 * time.Second): // the observation window
	}
	for i := range admins {
		// Less our INFO; a keep-alive PING of the subscriber is fine.
		if n := counters[i].total(t) - before[i] - 1; n > 2 {
			t.Errorf("node %d executed %d commands while the waiter slept: %v", i, n, statsDiff(beforeStats[i], counters[i].stats(t)))
		}
	}
	start := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
	t.Logf("woken %v after the release", time.Since(start))
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRedlockCancelledLockLeavesNothing(t *testing.T) {
	ss := spawnNodes(t, 3)
	rs := newRedlocks(t, ss, 2)
	admins := nodeAdmins(t, ss)
	name := redistest.Name(t)
	holder := must(rs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := must(rs[1].NewMutex(name)).Lock(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock: %v, want DeadlineExceeded", err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, admins, name); len(l) > 0 {
		t.Fatalf("keys left: %v", l)
	}
}
