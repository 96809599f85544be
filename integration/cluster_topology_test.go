package integration

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// traced is a user's wrapper of a ClusterClient (one that adds tracing,
// say): it embeds the client, so redisync finds the cluster through it.
type traced struct{ *redis.ClusterClient }

// testClusterWrapped runs holds, waiters, renewals and a loss on every
// primary through wrapped cluster clients: the watchdog renews each slot
// on its own primary, and a hold deleted behind its holder's back is lost.
func testClusterWrapped(t *testing.T, c *redistest.Cluster) {
	const lease = 300 * time.Millisecond
	var cs []*redisync.Client
	for range 2 {
		cl, err := redisync.New(traced{c.NewClient(t)}, redisync.WithCrashTimeout(lease), redisync.WithRecheck(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Close() })
		cs = append(cs, cl)
	}
	admin := c.NewClient(t)
	names := namesOnEveryPrimary(t, c, admin, 6)
	var held []*redisync.Mutex
	var dones []chan error
	for _, name := range names {
		m := must(cs[0].NewMutex(name))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		held = append(held, m)
		w := must(cs[1].NewMutex(name))
		done := make(chan error, 1)
		go func() {
			err := w.Lock(ctx)
			if err == nil {
				err = w.Unlock(ctx)
			}
			done <- err
		}()
		dones = append(dones, done)
		eventually(t, 5*time.Second, "the waiter to queue", func() bool { return queueLen(t, admin, name) == 1 })
	}
	// Five leases: every hold is renewed, on its own primary, several times.
	end := time.Now().Add(5 * lease)
	for time.Now().Before(end) {
		for _, m := range held {
			select {
			case <-m.Lost():
				t.Fatalf("lock %s lost while its watchdog renewed it", m.Name())
			default:
			}
		}
		time.Sleep(lease / 10) // sampling interval
	}
	// A hold whose key is deleted behind its back is lost within a lease.
	if err := admin.Del(ctx, lockKey(names[0])).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held[0].Lost():
	case <-time.After(5 * lease):
		t.Fatalf("lock %s: Lost not closed %v after its key was deleted", names[0], 5*lease)
	}
	if err := held[0].Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
		t.Fatalf("Unlock of a lost hold: %v, want ErrLockLost", err)
	}
	for _, m := range held[1:] {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, dones, 10*time.Second)
}

// testClusterSlotMigration moves the slot of a fair lock to another
// primary while it is held and four waiters of three Clients are parked
// on it, with renewals and heartbeats running through the move. The hold
// survives, and once released the lock goes to each waiter in arrival
// order, each hand-off heard at once: a waiter deaf to its grant channel
// would learn of it only when its sleep ends, bounded by the 6 s lease.
// The move takes long enough (a step every 400 ms) for renewals (every
// 2 s) and heartbeats (every second) to run in the middle of it.
func testClusterSlotMigration(t *testing.T, c *redistest.Cluster) {
	const lease = 6 * time.Second
	cs := clusterClients(t, c, 3, redisync.WithCrashTimeout(lease), redisync.WithRecheck(time.Minute))
	admin := c.NewClient(t)
	name := redistest.Name(t)
	holder := must(cs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		got    []int
		tokens []int64
		at     []time.Time
	)
	var dones []chan error
	for i := range 4 {
		m := must(cs[i%3].NewMutex(name))
		done := make(chan error, 1)
		go func() {
			err := m.Lock(ctx)
			if err == nil {
				mu.Lock()
				got, tokens, at = append(got, i), append(tokens, m.Token()), append(at, time.Now())
				mu.Unlock()
				err = m.Unlock(ctx)
			}
			done <- err
		}()
		dones = append(dones, done)
		eventually(t, 5*time.Second, "the waiter to queue", func() bool { return queueLen(t, admin, name) == int64(i+1) })
	}
	var to *redistest.Server
	from := c.PrimaryFor(t, admin, lockKey(name))
	for _, s := range c.Nodes[:3] { // the primaries, as created
		if s != from {
			to = s
			break
		}
	}
	c.MigrateSlot(t, admin, lockKey(name), to, func() { time.Sleep(400 * time.Millisecond) })
	if now := c.PrimaryFor(t, admin, lockKey(name)); now != to {
		t.Fatalf("the slot is served by %s after the move, want %s", now.Addr, to.Addr)
	}
	select {
	case <-holder.Lost():
		t.Fatal("the hold was lost while its slot moved")
	default:
	}
	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitAll(t, dones, 20*time.Second)
	if fmt.Sprint(got) != "[0 1 2 3]" {
		t.Fatalf("acquisition order %v after the move, want arrival order", got)
	}
	increasing(t, tokens)
	prev := released
	for i, when := range at {
		// A grant that is not heard is found when the waiter's
		// sleep ends (up to the lease): a heard one takes milliseconds.
		if gap := when.Sub(prev); gap > 2*time.Second {
			t.Fatalf("hand-off %d took %v after the move: the grant was not heard", i, gap)
		}
		prev = when
	}
}

// TestClusterWithoutShardedPubSub: on a cluster without sharded pub/sub
// (Redis before 7; here SPUBLISH renamed away), the first call fails with
// ErrUnsupportedServer naming WithPlainPubSub, before any script runs,
// and works with it.
func TestClusterWithoutShardedPubSub(t *testing.T) {
	c := redistest.SpawnCluster(t, 3, 0, "--rename-command", "SPUBLISH", "")
	admin := c.NewClient(t)
	name := redistest.Name(t)
	sharded := clusterClients(t, c, 1)[0]
	err := must(sharded.NewMutex(name)).Lock(ctx)
	if !errors.Is(err, redisync.ErrUnsupportedServer) || !strings.Contains(err.Error(), "WithPlainPubSub") {
		t.Fatalf("Lock on a cluster without SPUBLISH: %v, want ErrUnsupportedServer naming WithPlainPubSub", err)
	}
	if n := admin.Exists(ctx, lockKey(name)).Val(); n != 0 {
		t.Fatal("the refused Lock wrote the lock")
	}
	cs := clusterClients(t, c, 2, redisync.WithPlainPubSub(), redisync.WithRecheck(time.Minute))
	contend(t, mutexes(cs, name, 4), time.Millisecond, rounds(5))
}
