package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// clusterClients returns n redisync Clients on cluster clients of their
// own, closed at the end of the test.
func clusterClients(t *testing.T, c *redistest.Cluster, n int, opts ...redisync.Option) []*redisync.Client {
	t.Helper()
	cs := make([]*redisync.Client, n)
	for i := range cs {
		nc, err := redisync.New(c.NewClient(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = nc
		cl := cs[i]
		t.Cleanup(func() { _ = cl.Close() })
	}
	return cs
}

// namesOnEveryPrimary returns n lock names whose slots cover every primary
// of the cluster.
func namesOnEveryPrimary(t *testing.T, c *redistest.Cluster, rdb *redis.ClusterClient, n int) []string {
	t.Helper()
	var names []string
	primaries := map[string]bool{}
	for i := 0; len(names) < n || len(primaries) < 3; i++ {
		name := fmt.Sprintf("%s-%d", redistest.Name(t), i)
		primaries[c.PrimaryFor(t, rdb, lockKey(name)).Addr] = true
		names = append(names, name)
	}
	return names
}

func TestCluster(t *testing.T) {
	c := redistest.SpawnCluster(t, 3, 1)
	t.Run("ExclusionAcrossSlots", func(t *testing.T) { testClusterExclusion(t, c) })
	t.Run("RenewalAcrossSlots", func(t *testing.T) { testClusterRenewal(t, c) })
	t.Run("FairOrder", func(t *testing.T) { testClusterFairOrder(t, c) })
	t.Run("PlainPubSub", func(t *testing.T) { testClusterPlainPubSub(t, c) })
	t.Run("Semaphore", func(t *testing.T) { testClusterSemaphore(t, c) })
	t.Run("RWMutex", func(t *testing.T) { testClusterRWMutex(t, c) })
	t.Run("WrappedClient", func(t *testing.T) { testClusterWrapped(t, c) })
	t.Run("SlotMigration", func(t *testing.T) { testClusterSlotMigration(t, c) })
	t.Run("Failover", func(t *testing.T) { testClusterFailover(t, c) })
}

// testClusterExclusion contends for locks whose slots are on every
// primary, with a short watchdog lease so that renewals of holds on
// different slots fall due together, and checks that each Client
// subscribes through one connection per primary at most.
func testClusterExclusion(t *testing.T, c *redistest.Cluster) {
	cs := clusterClients(t, c, 3, redisync.WithCrashTimeout(300*time.Millisecond))
	admin := c.NewClient(t)
	names := namesOnEveryPrimary(t, c, admin, 12)
	var wg sync.WaitGroup
	errs := make(chan error, 48)
	ins := make([]inCS, len(names))
	for i := range 48 {
		k := i % len(names)
		m := must(cs[i%3].NewMutex(names[k]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if err := m.Lock(ctx); err != nil {
					errs <- err
					return
				}
				ins[k].enter()
				time.Sleep(2 * time.Millisecond) // the work, long enough for renewals to batch
				ins[k].leave()
				if err := m.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// While they contend, count each node's pub/sub connections.
	maxConns := 0
	for done := waitGroupDone(&wg); ; {
		for _, addr := range c.Addrs() {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			list, _ := rdb.ClientList(ctx).Result()
			_ = rdb.Close()
			n := 0
			for _, line := range strings.Split(list, "\n") {
				if strings.Contains(line, "ssub=") && !strings.Contains(line, "ssub=0") {
					n++
				}
			}
			maxConns = max(maxConns, n)
		}
		select {
		case <-done:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		break
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range ins {
		if n := ins[k].max.Load(); n != 1 {
			t.Fatalf("lock %s: %d holders at once", names[k], n)
		}
	}
	if maxConns > len(cs) {
		t.Fatalf("a node had %d sharded subscriber connections, want at most one per Client (%d)", maxConns, len(cs))
	}
	t.Logf("at most %d sharded subscriber connections per node for %d Clients and %d locks", maxConns, len(cs), len(names))
}

// testClusterRenewal holds locks on every primary for several watchdog
// intervals: the watchdog's renewals, due together, must go one slot per
// script call (a cluster refuses a script whose keys span slots).
func testClusterRenewal(t *testing.T, c *redistest.Cluster) {
	const lease = 300 * time.Millisecond
	cl := clusterClients(t, c, 1, redisync.WithCrashTimeout(lease))[0]
	admin := c.NewClient(t)
	var held []*redisync.Mutex
	for _, name := range namesOnEveryPrimary(t, c, admin, 6) {
		m := must(cl.NewMutex(name))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		held = append(held, m)
	}
	deadline := time.After(5 * lease)
	for {
		select {
		case <-deadline:
		default:
			for _, m := range held {
				select {
				case <-m.Lost():
					t.Fatalf("lock %s lost while its watchdog renewed it", m.Name())
				default:
				}
			}
			time.Sleep(lease / 10) // sampling interval
			continue
		}
		break
	}
	for _, m := range held {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// testClusterPlainPubSub contends with WithPlainPubSub, for clusters
// older than Redis 7: PUBLISH reaches subscribers on any node.
func testClusterPlainPubSub(t *testing.T, c *redistest.Cluster) {
	cs := clusterClients(t, c, 2, redisync.WithPlainPubSub(), redisync.WithRecheck(time.Minute))
	admin := c.NewClient(t)
	for _, name := range namesOnEveryPrimary(t, c, admin, 3) {
		contend(t, mutexes(cs, name, 8), time.Millisecond, rounds(5))
	}
}

// testClusterSemaphore contends for semaphores of size 3 on every
// primary, with a short watchdog lease so that permit renewals of
// different slots fall due together.
func testClusterSemaphore(t *testing.T, c *redistest.Cluster) {
	const size = 3
	cs := clusterClients(t, c, 3, redisync.WithCrashTimeout(300*time.Millisecond))
	admin := c.NewClient(t)
	names := namesOnEveryPrimary(t, c, admin, 3)
	ins := make([]inCS, len(names))
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 24 {
		k := i % len(names)
		s := must(cs[i%3].NewSemaphore(names[k], size))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				if err := s.Acquire(ctx, 1); err != nil {
					errs <- err
					return
				}
				ins[k].enter()
				time.Sleep(2 * time.Millisecond) // the work done with a permit
				ins[k].leave()
				if err := s.Release(ctx, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range ins {
		if n := ins[k].max.Load(); n > size {
			t.Fatalf("semaphore %s: %d holders at once, want at most %d", names[k], n, size)
		}
	}
	// That the contention above overlapped holders depends on timing (a
	// name with two goroutines may never see them inside together on a
	// loaded machine); that a semaphore admits size holders, and no more,
	// does not.
	for _, name := range names {
		var held []*redisync.Semaphore
		for i := range size + 1 {
			s := must(cs[i%3].NewSemaphore(name, size))
			ok, err := s.TryAcquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if ok != (i < size) {
				t.Fatalf("semaphore %s: TryAcquire number %d got %v, want %v", name, i+1, ok, i < size)
			}
			if ok {
				held = append(held, s)
			}
		}
		for _, s := range held {
			if err := s.Release(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// waitGroupDone returns a channel closed when wg is done.
func waitGroupDone(wg *sync.WaitGroup) <-chan struct{} {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

func testClusterFairOrder(t *testing.T, c *redistest.Cluster) {
	cs := clusterClients(t, c, 3)
	admin := c.NewClient(t)
	for _, name := range namesOnEveryPrimary(t, c, admin, 3) {
		holder := must(cs[0].NewMutex(name))
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		var o order
		var dones []<-chan error
		for i := range 6 {
			dones = append(dones, queueWaiter(t, admin, name, must(cs[(i*2)%3].NewMutex(name)), ctx, i, &o, int64(i+1)))
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		for _, d := range dones {
			if err := <-d; err != nil {
				t.Fatal(err)
			}
		}
		if got := o.get(); fmt.Sprint(got) != "[0 1 2 3 4 5]" {
			t.Fatalf("lock %s: acquisition order %v, want arrival order", name, got)
		}
		assertClean(t, admin, name)
	}
}

// testClusterFailover kills the primary that serves one fair lock while
// waiters block on it and on a lock of another primary. The other
// primary's waiters are served as usual; the failed-over lock's waiters
// all get it once the replica has taken over.
func testClusterFailover(t *testing.T, c *redistest.Cluster) {
	cs := clusterClients(t, c, 2, redisync.WithCrashTimeout(2*time.Second), redisync.WithRecheck(time.Minute))
	admin := c.NewClient(t)
	names := namesOnEveryPrimary(t, c, admin, 2)
	doomed := c.PrimaryFor(t, admin, lockKey(names[0]))
	var other string
	for _, n := range names[1:] {
		if c.PrimaryFor(t, admin, lockKey(n)) != doomed {
			other = n
			break
		}
	}

	holders := map[string]*redisync.Mutex{}
	dones := map[string][]chan error{}
	for _, name := range []string{names[0], other} {
		holders[name] = must(cs[0].NewMutex(name))
		if err := holders[name].Lock(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			m := must(cs[i%2].NewMutex(name))
			done := make(chan error, 1)
			go func() {
				err := m.Lock(ctx)
				if err == nil {
					err = m.Unlock(ctx)
				}
				done <- err
			}()
			dones[name] = append(dones[name], done)
			// Queued: its first attempt is done, so it is waiting.
			eventually(t, 10*time.Second, "the waiter to queue", func() bool {
				return queueLen(t, admin, name) == int64(i+1)
			})
		}
	}

	doomed.Kill(t)
	// Waiters on the surviving primary are served as if nothing happened.
	if err := holders[other].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitAll(t, dones[other], 10*time.Second)

	c.WaitOK(t, 30*time.Second) // the replica has taken over
	// The holder's key may or may not have reached the replica before the
	// primary died; either its Unlock frees the lock or its lease runs out.
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_ = holders[names[0]].Unlock(uctx)
	cancel()
	waitAll(t, dones[names[0]], 20*time.Second)

	doomed.Restart(t) // back as a replica of the new primary
	c.WaitOK(t, 30*time.Second)
}

// waitAll waits for every channel to deliver a nil error within d.
func waitAll(t *testing.T, dones []chan error, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for _, done := range dones {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			t.Fatalf("waiters still blocked after %v", d)
		}
	}
}
