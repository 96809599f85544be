package redisync

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
)

// The semaphore scripts' work is bounded by constants (scripts/sem_lib.lua:
// reclaim_max, serve_max, prune_max) whatever the number of holders and
// waiters: on a Redis that other services share, no call of redisync
// holds the server for long. These tests build 10,000 holders or queued
// readers on a real Redis and read every script call's time in SLOWLOG.

// scriptBound is the longest a script call may take on a shared Redis.
// A call's time in SLOWLOG is wall time: on a busy machine (these tests
// run beside others, under the race detector) the server's thread may
// wait for a CPU in the middle of a call. So judgeCalls requires the
// median call to keep within it, and at most one call in 10 to take
// longer (a script whose work grew with the 10,000 would take several ms
// at every call; these take 0.2-0.3 ms on an idle machine).
const scriptBound = time.Millisecond

// slowlogAll makes the server log every command in SLOWLOG, from empty,
// until the test ends.
func slowlogAll(t *testing.T, rdb *redis.Client) {
	t.Helper()
	ctx := context.Background()
	old, err := rdb.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for k, v := range old {
			rdb.ConfigSet(ctx, k, v)
		}
		rdb.Do(ctx, "SLOWLOG", "RESET")
	})
	for k, v := range map[string]string{"slowlog-log-slower-than": "0", "slowlog-max-len": "1000000"} {
		if err := rdb.ConfigSet(ctx, k, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
}

// judgeCalls reads the script calls (FCALL, EVALSHA, EVAL) on keys under
// tag logged in SLOWLOG, and fails the test unless they keep within
// scriptBound (see there). It returns a summary for the log.
func judgeCalls(t *testing.T, rdb *redis.Client, tag string) string {
	t.Helper()
	logs, err := rdb.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for _, l := range logs {
		if len(l.Args) == 0 {
			continue
		}
		switch strings.ToLower(l.Args[0]) {
		case "fcall", "fcall_ro", "evalsha", "eval":
		default:
			continue
		}
		if !strings.Contains(strings.Join(l.Args, " "), tag) {
			continue
		}
		took = append(took, l.Duration)
		if l.Duration > scriptBound {
			t.Logf("%v: %.200s", l.Duration, strings.Join(l.Args, " "))
		}
	}
	if len(took) == 0 {
		t.Fatal("no script call in SLOWLOG")
	}
	slices.Sort(took)
	median, longest := took[len(took)/2], took[len(took)-1]
	over := len(took) - sort.Search(len(took), func(i int) bool { return took[i] > scriptBound })
	if median > scriptBound || over > len(took)/10 {
		t.Errorf("script calls: median %v, %d of %d over %v; want the median within it and at most one in 10 over",
			median, over, len(took), scriptBound)
	}
	return fmt.Sprintf("%d script calls, median %v, longest %v", len(took), median, longest)
}

// TestRWMutexWriterGrantsTenThousandReadersInBoundedCalls: a writer's
// Unlock with 10,000 readers queued grants them, in order, in calls of at
// most 8 grants each: each call asks the next readers to go on (a message
// "waiter:0:ms"), whose own calls grant the next ones. The readers before
// the last are written into the queue as the scripts write them, with a
// stand-in for their processes that answers those messages as a reader
// does (it calls the acquire script); the last is a real RLock.
func TestRWMutexWriterGrantsTenThousandReadersInBoundedCalls(t *testing.T) {
	const readers = 10_000
	rdb := newReal(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.RWMutexKeys("redisync", name)
	writer := must(newClient(t, rdb).NewRWMutex(name))
	if err := writer.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	// The queued readers, of one process "pc": holder t/pc-i, waiter
	// t/pc-i#1, each wanting 1 permit, alive for two minutes.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	reader := func(i int) string { return fmt.Sprintf("t/pc-%d#1", i) }
	p := rdb.Pipeline()
	for i := range readers {
		p.ZAdd(ctx, k.Queue, redis.Z{Score: float64(now.UnixMicro() - readers + int64(i)), Member: reader(i)})
		p.HSet(ctx, k.Hash, reader(i), fmt.Sprintf("%d:60000:1:1", now.UnixMilli()+120_000))
	}
	p.PExpire(ctx, k.Queue, 10*time.Minute)
	p.PExpire(ctx, k.Hash, 10*time.Minute)
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	// The stand-in process: a message without permits asks the reader to
	// call again, which serves the queue on from it.
	sub := rdb.Subscribe(ctx, k.Channel+":pc")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer func() { sub.Close(); wg.Wait() }() // the stand-in ends when sub closes
	answered := make(chan int, 1)
	var order []int // the readers granted, in the order of the messages
	wg.Add(1)
	go func() {
		defer wg.Done()
		n := 0
		defer func() { answered <- n }()
		for m := range sub.Channel() {
			for _, g := range strings.Fields(m.Payload) {
				waiter, permits, _, ok := waiters.ParseGrant(g)
				if ok && permits == 1 {
					var i int
					if _, err := fmt.Sscanf(waiter, "t/pc-%d#1", &i); err == nil {
						order = append(order, i)
					}
				}
				if !ok || permits != 0 {
					continue
				}
				n++
				holder := strings.TrimSuffix(waiter, "#1")
				err := semAcquireArgs{holder: holder, n: 1, size: schema.RWMutexSize, seq: 1, lease: time.Minute, mode: "queue",
					waiter: waiter, queued: true, heartbeat: 2 * time.Minute, grant: time.Minute, publish: "PUBLISH", fence: true}.call(k).run(ctx, rdb).Err()
				if err != nil {
					t.Errorf("%s's call: %v", waiter, err)
				}
			}
		}
	}()

	last := must(newClient(t, rdb).NewRWMutex(name))
	rlocked := async(func() error { return last.RLock(ctx) })
	waitFor(t, "the last reader queued", func() bool { return rdb.ZCard(ctx, k.Queue).Val() == readers+1 })

	// The stand-in sends the script as a script (a Client sends
	// functions): its compilation, once per server, is not a call's work.
	if err := rdb.ScriptLoad(ctx, semAcquireScript.src).Err(); err != nil {
		t.Fatal(err)
	}
	slowlogAll(t, rdb)
	start := time.Now()
	if err := writer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rlocked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the last reader was not granted within a minute; queue %d", rdb.ZCard(ctx, k.Queue).Val())
	}
	took := time.Since(start)
	// FIFO: the last reader was granted after every reader ahead of it.
	if q := rdb.ZCard(ctx, k.Queue).Val(); q != 0 {
		t.Fatalf("%d readers still queued when the last was granted", q)
	}
	if used := rdb.HGet(ctx, k.Hash, schema.SemUsedField).Val(); used != fmt.Sprintf("%d:%d", readers+1, schema.SemLayout) {
		t.Fatalf("permits in use %q, want %d", used, readers+1)
	}
	calls := judgeCalls(t, rdb, "{"+name+"}")
	sub.Close()
	wg.Wait()
	// The readers a message granted (a reader's own call is granted in
	// its reply) came in the order they queued.
	for j := 1; j < len(order); j++ {
		if order[j] <= order[j-1] {
			t.Fatalf("reader %d granted after reader %d", order[j], order[j-1])
		}
	}
	if len(order) < readers/2 {
		t.Fatalf("%d grants by message, want most of the %d", len(order), readers)
	}
	t.Logf("%d readers granted in %v (%d asked to go on); %s", readers+1, took.Round(time.Millisecond), <-answered, calls)
	if err := last.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreWithTenThousandHoldersIsBounded: with 10,000 holders, half
// of them with a lease that has ended, every Acquire, TryAcquire and
// Release call stays within scriptBound; the ended leases are reclaimed
// by the calls, at most 32 per call.
func TestSemaphoreWithTenThousandHoldersIsBounded(t *testing.T) {
	const holders = 10_000
	rdb := newReal(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.SemaphoreKeys("redisync", name)
	const size = holders + 10
	addSemHolders(t, rdb, k, size, holders, func(i int) time.Duration {
		if i%2 == 0 {
			return 3 * time.Second
		}
		return time.Hour
	})
	if used := rdb.HGet(ctx, k.Hash, schema.SemUsedField).Val(); used != fmt.Sprintf("%d:%d", holders, schema.SemLayout) {
		t.Fatalf("permits in use %q, want %d", used, holders)
	}
	ended := func() bool {
		now, err := rdb.Time(ctx).Result()
		first := rdb.ZRangeWithScores(ctx, k.Expiry, holders/2-1, holders/2-1).Val()
		return err == nil && len(first) == 1 && int64(first[0].Score) < now.UnixMilli()
	}
	waitFor(t, "the short leases end", ended)

	slowlogAll(t, rdb)
	s := must(newClient(t, rdb).NewSemaphore(name, size))
	rounds := 0
	for rdb.ZCard(ctx, k.Expiry).Val() > holders/2 {
		if rounds++; rounds > holders/2/32+5 {
			t.Fatalf("%d rounds, and %d leases are left", rounds, rdb.ZCard(ctx, k.Expiry).Val())
		}
		if ok, err := s.TryAcquire(ctx, 1); err != nil {
			t.Fatal(err)
		} else if ok {
			if err := s.Release(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Acquire(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if used := rdb.HGet(ctx, k.Hash, schema.SemUsedField).Val(); used != fmt.Sprintf("%d:%d", holders/2, schema.SemLayout) {
		t.Fatalf("permits in use %q after the ended leases were reclaimed, want %d", used, holders/2)
	}
	t.Logf("%d ended leases reclaimed in %d rounds; %s", holders/2, rounds, judgeCalls(t, rdb, "{"+name+"}"))
}

// A semaphore's release that frees permits for more waiters than one call
// grants asks the next ones to go on; waiters that do not answer (a
// process paused, or cut off from Redis) hold back nobody behind them:
// here nine silent waiters queue ahead of a live Acquire, whose sleep
// bound and heartbeat are an hour, and the release of every permit must
// reach it at once.
func TestSemaphoreSilentWaitersDoNotHoldBackTheQueue(t *testing.T) {
	rdb := newReal(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.SemaphoreKeys("redisync", name)
	c := newClient(t, rdb, WithRecheck(time.Hour), WithWaiterTimeout(time.Hour))
	holder := must(c.NewSemaphore(name, 20))
	if err := holder.Acquire(ctx, 20); err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	p := rdb.Pipeline()
	for i := range 9 {
		w := fmt.Sprintf("t/silent-%d#1", i)
		p.ZAdd(ctx, k.Queue, redis.Z{Score: float64(now.UnixMicro() - 100 + int64(i)), Member: w})
		p.HSet(ctx, k.Hash, w, fmt.Sprintf("%d:60000:1:1", now.UnixMilli()+120_000))
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	w := must(newClient(t, rdb, WithRecheck(time.Hour), WithWaiterTimeout(time.Hour)).NewSemaphore(name, 20))
	acquired := async(func() error { return w.Acquire(ctx, 1) })
	waitFor(t, "the live waiter queued", func() bool { return rdb.ZCard(ctx, k.Queue).Val() == 10 })
	start := time.Now()
	if err := holder.Release(ctx, 20); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-acquired:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the live waiter behind nine silent ones was not granted within 5 s; queue %d", rdb.ZCard(ctx, k.Queue).Val())
	}
	t.Logf("granted %v after the release", time.Since(start).Round(time.Microsecond))
	if err := w.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreTryAcquireReclaimsEveryEndedLease: after a stall that ended
// more leases than one call reclaims (here 40 holders of one permit each,
// a semaphore of 40), TryAcquire of every permit succeeds: nobody holds or
// waits, and it goes on as long as the script asks for a call at once.
func TestSemaphoreTryAcquireReclaimsEveryEndedLease(t *testing.T) {
	const size = 40
	rdb := newReal(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.SemaphoreKeys("redisync", name)
	addSemHolders(t, rdb, k, size, size, func(int) time.Duration { return 100 * time.Millisecond })
	waitFor(t, "every lease to end", func() bool {
		now, err := rdb.Time(ctx).Result()
		last := rdb.ZRangeWithScores(ctx, k.Expiry, -1, -1).Val()
		return err == nil && len(last) == 1 && int64(last[0].Score) < now.UnixMilli()
	})
	s := must(newClient(t, rdb).NewSemaphore(name, size))
	if ok, err := s.TryAcquire(ctx, size); err != nil || !ok {
		t.Fatalf("TryAcquire(%d) with every lease ended: %v, %v; want true", size, ok, err)
	}
	if err := s.Release(ctx, size); err != nil {
		t.Fatal(err)
	}
}

// addSemHolders makes n holders of one permit each, "t/pc-i" with a lease
// of lease(i), on the semaphore k of the given size, as the acquire script
// makes them: sent in a pipeline (EVALSHA, which has no fallback to EVAL
// there), the script loaded first.
func addSemHolders(t *testing.T, rdb *redis.Client, k schema.Semaphore, size int64, n int, lease func(i int) time.Duration) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.ScriptLoad(ctx, semAcquireScript.src).Err(); err != nil {
		t.Fatal(err)
	}
	p := rdb.Pipeline()
	for i := range n {
		holder := fmt.Sprintf("t/pc-%d", i)
		semAcquireArgs{holder: holder, n: 1, size: size, seq: 1, lease: lease(i), mode: "try", waiter: holder + "#1",
			heartbeat: time.Minute, grant: time.Minute, publish: "PUBLISH"}.call(k).run(ctx, p)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}
