package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestMultiMutexCluster runs MultiMutexes on a Redis Cluster of 3
// primaries: names on every primary, taken one slot at a time; and names
// with a common hash tag, taken in one script call.
func TestMultiMutexCluster(t *testing.T) {
	c := redistest.SpawnCluster(t, 3, 0)
	t.Run("AcrossSlots", func(t *testing.T) { testMultiAcrossSlots(t, c) })
	t.Run("Calls", func(t *testing.T) { testMultiCalls(t, c) })
}

// testMultiAcrossSlots has 3 Clients' workers lock sets of 2 to 4 of 6
// names (on every primary), given in random orders, and single names,
// with deadlines of 0-5 ms or 20 s, for 1.5 s: no two holders are ever
// inside one name at once, and every worker ends within 10 s of the end
// (no deadlock across slots).
func testMultiAcrossSlots(t *testing.T, c *redistest.Cluster) {
	cs := clusterClients(t, c, 3)
	names := namesOnEveryPrimary(t, c, c.NewClient(t), 6)
	ins := make(map[string]*inCS)
	for _, n := range names {
		ins[n] = &inCS{}
	}
	var holds, multis atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, 100)
	var wg sync.WaitGroup
	for w := range 9 {
		rng := rand.New(rand.NewPCG(uint64(w), 18))
		set := rng.Perm(len(names))[:1+rng.IntN(4)]
		var ns []string
		for _, i := range set {
			ns = append(ns, names[i])
		}
		m := must(cs[w%3].NewMultiMutex(ns))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := 20 * time.Second
				if rng.IntN(2) == 0 {
					d = time.Duration(rng.IntN(5000)) * time.Microsecond
				}
				lctx, cancel := context.WithTimeout(ctx, d)
				err := m.Lock(lctx)
				cancel()
				if err != nil {
					if lctx.Err() == nil {
						errs <- err
					}
					continue
				}
				for _, n := range ns {
					ins[n].enter()
				}
				time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond) // the critical section
				for _, n := range ns {
					ins[n].leave()
				}
				if err := m.Unlock(ctx); err != nil {
					errs <- err
				}
				holds.Add(1)
				if len(ns) > 1 {
					multis.Add(1)
				}
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond) // the run's length, not a wait for something
	close(stop)
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatalf("workers still running 10 s after the end (deadlock?): %d holds so far", holds.Load())
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for n, in := range ins {
		if in.max.Load() > 1 {
			t.Errorf("%s: %d holders inside at once", n, in.max.Load())
		}
	}
	t.Logf("%d holds, %d of them of 2 names or more", holds.Load(), multis.Load())
	if multis.Load() < 20 {
		t.Errorf("only %d multi holds: the run proved too little", multis.Load())
	}
}

// scriptCalls counts the script calls (EVALSHA, EVAL) a cluster client
// sends.
type scriptCalls struct{ n atomic.Int64 }

func (s *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			s.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (s *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// testMultiCalls counts the script calls of a Lock and an Unlock of three
// free names: one each when they share a hash tag, one per name each when
// they are on different slots.
func testMultiCalls(t *testing.T, c *redistest.Cluster) {
	rdb := c.NewClient(t)
	calls := &scriptCalls{}
	rdb.AddHook(calls)
	client, err := redisync.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	tag := "{" + redistest.Name(t) + "}"
	for _, tc := range []struct {
		name  string
		names []string
		want  int64
	}{
		{"common hash tag", []string{tag + "a", tag + "b", tag + "c"}, 2},
		{"across slots", namesOnEveryPrimary(t, c, rdb, 3)[:3], 6},
	} {
		m := must(client.NewMultiMutex(tc.names))
		var got int64
		for range 2 { // the first loads the scripts
			before := calls.n.Load()
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			got = calls.n.Load() - before
		}
		t.Logf("%s: %d script calls for a Lock and an Unlock of 3 free names", tc.name, got)
		if got != tc.want {
			t.Errorf("%s: %d script calls, want %d", tc.name, got, tc.want)
		}
	}
}

// TestMultiMutexUnlockAfterALeaseRanOutIsLost: Unlock reports ErrLockLost
// when one name's lease ran out in Redis and another Client took it since.
func TestMultiMutexUnlockAfterALeaseRanOutIsLost(t *testing.T) {
	cs := newClients(t, 2)
	n1, n2 := redistest.Name(t)+"-1", redistest.Name(t)+"-2"
	mm := must(cs[0].NewMultiMutex([]string{n1, n2}))
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	jumpClock(t, admin(t), n1) // its lease runs out
	other := must(cs[1].NewMutex(n1))
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		t.Fatalf("the other Client's TryLock: %v, %v", ok, err)
	}
	if err := mm.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
		t.Errorf("Unlock = %v, want ErrLockLost", err)
	}
	if heldOn(t, admin(t), lockKey(n2)) {
		t.Errorf("%s is still held after the Unlock", n2)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
