package redisync

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// keepAliveScript runs lib.lua's keep_alive(KEYS[1], ARGV[1]), or
// keep_longer when ARGV[3] is "longer", and replies the key's PTTL
// afterwards. With ARGV[2] "6" it runs as on a Redis before 7, whose
// PEXPIRE has no GT option and fails when given one.
var keepAliveScript = testScript(`
if ARGV[2] == '6' then
  local pcall = redis.pcall
  redis.pcall = function(cmd, key, ms, opt)
    if opt then
      return {err = "ERR wrong number of arguments for 'pexpire' command"}
    end
    return pcall(cmd, key, ms)
  end
end
` + luaLib + `
if ARGV[3] == 'longer' then
  keep_longer(KEYS[1], tonumber(ARGV[1]))
else
  keep_alive(KEYS[1], tonumber(ARGV[1]))
end
return redis.call('PTTL', KEYS[1])`)

// keep_alive extends a TTL to at least its argument and never shortens
// one, on a Redis 7 (PEXPIRE GT) and on an older Redis: a key created
// without a TTL, which GT leaves as it is, gets one too.
func TestKeepAliveNeverShortens(t *testing.T) {
	// miniredis lets a script replace redis.pcall, which stands in for a
	// Redis 6 here; Redis 7 does not.
	mini := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { mini.Close() })
	rdb := redistest.Client(t)
	for _, tc := range []struct {
		name    string
		rdb     redis.Cmdable
		version string
		fn      string
	}{
		{"redis", rdb, "7", "alive"},
		{"miniredis", mini, "7", "alive"},
		{"without PEXPIRE GT", mini, "6", "alive"},
		{"keep_longer", rdb, "7", "longer"},
		{"keep_longer on miniredis", mini, "7", "longer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := redistest.Name(t)
			keep := func(ms int64) int64 {
				t.Helper()
				pttl, err := keepAliveScript.Run(ctx, tc.rdb, []string{key}, ms, tc.version, tc.fn).Int64()
				if err != nil {
					t.Fatal(err)
				}
				return pttl
			}
			if got := keep(5000); got != -2 {
				t.Errorf("missing key: PTTL %d after keep_alive, want -2 (not created)", got)
			}
			tc.rdb.Set(ctx, key, "v", 0)
			if got := keep(5000); got <= 4000 || got > 5000 {
				t.Errorf("key without a TTL: PTTL %d after keep_alive(5000), want about 5000", got)
			}
			if got := keep(60000); got <= 59000 || got > 60000 {
				t.Errorf("shorter TTL: PTTL %d after keep_alive(60000), want about 60000", got)
			}
			if got := keep(1000); got <= 59000 {
				t.Errorf("longer TTL: PTTL %d after keep_alive(1000), want it kept (about 60000)", got)
			}
		})
	}
}

// A queue that a join makes gets the TTL of the lock's or semaphore's
// state at once (the waiter's next attempt, which would hide a missing
// one, may be seconds away), and a longer TTL is never shortened. These
// run acquire.lua and sem_acquire.lua once per join and read the queue's
// PTTL right after.
func TestQueueTTLAfterJoin(t *testing.T) {
	mini := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { mini.Close() })
	const hb = 3 * time.Second
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
				// The queue lives as long as the lock's or the semaphore's
				// state: an hour past its last use at least.
				state := schema.LockKeys("redisync", name).Hash
				if kind == "sem" {
					state = schema.SemaphoreKeys("redisync", name).Hash
				}
				if res := take(1); res[0] != 0 {
					t.Fatalf("first waiter: %v", res)
				}
				// Both TTLs derive from one end time, set in whole
				// milliseconds by calls a millisecond or so apart.
				hash := rdb.PTTL(ctx, state).Val()
				if got := pttl(); got < hash-time.Second || got > hash+5*time.Millisecond || hash < time.Hour {
					t.Errorf("new queue: PTTL %v, want the state's, %v (an hour at least)", got, hash)
				}
				if kind == "lock" {
					return
				}
				// A queue with a longer TTL keeps it (never shortened).
				rdb.PExpire(ctx, queue, 3*time.Hour)
				take(2)
				if got := pttl(); got <= 2*time.Hour {
					t.Errorf("queue with a longer TTL: PTTL %v after a join, want it kept (about 3h)", got)
				}
				take(3)
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
func TestKeepAliveNonPositive(t *testing.T) {
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

// The queue stays in arrival order when the server clock steps back.
func TestQueueOrderSurvivesAClockStepBack(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "job")
	now := time.Now()
	mr.SetTime(now)
	h := newClient(t, rdb)
	mh := must(h.NewMutex("job"))
	if err := mh.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var ms []*Mutex
	errs := make(chan error, 2)
	for i := range 2 {
		m := must(newClient(t, rdb, WithLabel("w"+strconv.Itoa(i))).NewMutex("job"))
		ms = append(ms, m)
		go func() { errs <- m.Lock(lctx) }()
		eventually(t, 5*time.Second, "a waiter to queue", func() bool {
			return len(queuedTickets(t, mr, k)) == i+1
		})
		mr.SetTime(now.Add(-time.Hour)) // the clock steps back
	}
	st, err := h.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Queue) != 2 || st.Queue[0].Label != "w0" || st.Queue[1].Label != "w1" {
		t.Fatalf("queue %+v; want w0 then w1", st.Queue)
	}
	if err := mh.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if ms[0].Token() == 0 {
		t.Errorf("w1 got the lock before w0")
	}
	cancel()
	<-errs
	_ = ms[0].Unlock(ctx)
}
