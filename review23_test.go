package redisync

// Review 23 (e431dd3): join_queue sets a new queue's TTL itself (one
// PEXPIRE), and keep_alive sets a TTL with PEXPIRE NX where GT did not.
// No root test looked at a lock's queue TTL right after the script that
// queued a waiter: dropping join_queue's PEXPIRE for the lock's queue
// (record ~= nil) passed the whole root suite, and the public-API test
// cannot see it, since the waiter's next attempt (keep_alive) follows at
// once. These run acquire.lua and sem_acquire.lua once per join and read
// the queue's PTTL right after.

import (
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

func TestReview23QueueTTLAfterJoin(t *testing.T) {
	mini := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { mini.Close() })
	const hb = 3 * time.Second // queue TTL: 2 * hb
	for _, be := range []struct {
		name string
		rdb  *redis.Client
	}{
		{"miniredis", mini},
		{"redis", redistest.Client(t)},
	} {
		for _, kind := range []string{"lock", "sem"} {
			t.Run(be.name+"/"+kind, func(t *testing.T) {
				rdb := be.rdb
				name := redistest.Name(t)
				var queue string
				var take func(i int) []int64
				run := func(c scriptCall) []int64 {
					t.Helper()
					res, err := c.run(ctx, rdb).Int64Slice()
					if err != nil {
						t.Fatal(err)
					}
					return res
				}
				if kind == "lock" {
					k := schema.LockKeys("redisync", name)
					queue = k.Queue
					take = func(i int) []int64 {
						mode := "queue"
						if i == 0 {
							mode = "barge"
						}
						return run(acquireArgs{ticket: fmt.Sprintf("vm/1/c-%d", i), lease: time.Minute, mode: mode,
							heartbeat: hb, handoff: hb, publish: "PUBLISH"}.call(k))
					}
				} else {
					k := schema.SemaphoreKeys("redisync", name)
					queue = k.Queue
					take = func(i int) []int64 {
						h := fmt.Sprintf("vm/1/c-%d", i)
						return run(semAcquireArgs{holder: h, n: 1, size: 1, seq: 1, lease: time.Minute, mode: "queue",
							waiter: h + "#1", heartbeat: hb, grant: hb, publish: "PUBLISH"}.call(k))
					}
				}
				pttl := func() time.Duration { return rdb.PTTL(ctx, queue).Val() }
				if res := take(0); res[0] != 1 {
					t.Fatalf("holder: %v", res)
				}
				// A new queue: join_queue's own PEXPIRE.
				if res := take(1); res[0] != 0 || rdb.ZCard(ctx, queue).Val() != 1 {
					t.Fatalf("first waiter: %v", res)
				}
				if got := pttl(); got <= 2*hb-time.Second || got > 2*hb {
					t.Errorf("new queue: PTTL %v, want about %v", got, 2*hb)
				}
				// A queue with a longer TTL keeps it (never shortened).
				rdb.PExpire(ctx, queue, time.Hour)
				take(2)
				if got := pttl(); got <= 50*time.Minute {
					t.Errorf("queue with a longer TTL: PTTL %v after a join, want it kept (about 1h)", got)
				}
				// A queue that exists without a TTL gets one (GT, then NX).
				rdb.Persist(ctx, queue)
				take(3)
				if got := pttl(); got <= 2*hb-time.Second || got > 2*hb {
					t.Errorf("queue without a TTL: PTTL %v after a join, want about %v", got, 2*hb)
				}
				if n := rdb.ZCard(ctx, queue).Val(); n != 3 {
					t.Errorf("queue length %d, want 3", n)
				}
			})
		}
	}
}

// keep_alive(key, ms) with ms <= 0 never deletes a key or gives it a TTL:
// the NX call is made only for ms > 0 (a PEXPIRE in the past deletes).
// No caller in the library passes ms <= 0 today (heartbeat >= 3 ms, leases
// >= 1 ms; sem_resize's PTTLs fall on a size that has a TTL already).
func TestReview23KeepAliveNonPositive(t *testing.T) {
	mini := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { mini.Close() })
	for _, be := range []struct {
		name string
		rdb  *redis.Client
	}{
		{"miniredis", mini},
		{"redis", redistest.Client(t)},
	} {
		for _, ms := range []int64{0, -1} {
			t.Run(fmt.Sprintf("%s/%d", be.name, ms), func(t *testing.T) {
				key := redistest.Name(t)
				be.rdb.Set(ctx, key, "v", 0)
				t.Cleanup(func() { be.rdb.Del(ctx, key) })
				got, err := keepAliveScript.Run(ctx, be.rdb, []string{key}, ms, "7", "alive").Int64()
				if err != nil {
					t.Fatal(err)
				}
				if got != -1 {
					t.Errorf("key without a TTL: PTTL %d after keep_alive(%d), want -1 (kept as it was)", got, ms)
				}
			})
		}
	}
}
