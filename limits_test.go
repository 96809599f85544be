package redisync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/watchdog"
)

// The scripts check the limits that the Go side checks before any call
// (a lease or heartbeat of at most MaxLease, metadata and election values
// of at most MaxMetadataLen bytes, renewals of at most watchdog.Batch
// entries) again where the data is: a caller that is not this library
// gets ErrInvalidOption, and nothing is written.
func TestScriptsEnforceTheLimits(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "limits")
	acquire := func(mode string, lease, heartbeat time.Duration, meta string) scriptCall {
		return acquireArgs{ticket: "vm/1/c-1", lease: lease, mode: mode, heartbeat: heartbeat,
			handoff: time.Second, publish: "PUBLISH", metadata: meta}.call(k)
	}
	renewals := func(n int, ttl time.Duration) scriptCall {
		batch := make([]watchdog.Renewal, n)
		for i := range batch {
			batch[i] = watchdog.Renewal{Kind: "hold", Owner: "vm/1/c-1", Keys: holdRenewKeys(k), TTL: ttl}
		}
		return renewCall(batch)
	}
	for _, tc := range []struct {
		what string
		call scriptCall
	}{
		{"a lease of 0", acquire("barge", 0, time.Second, "")},
		{"a lease over MaxLease", acquire("barge", MaxLease+time.Millisecond, time.Second, "")},
		{"a heartbeat over MaxLease", acquire("queue", time.Second, MaxLease+time.Millisecond, "")},
		{"metadata over MaxMetadataLen", acquire("queue", time.Second, time.Second, strings.Repeat("m", MaxMetadataLen+1))},
		{"an extension over MaxLease", extendArgs{id: "vm/1/c-1", lease: MaxLease + time.Millisecond}.call(k)},
		{"a renewal over MaxLease", renewals(1, MaxLease+time.Millisecond)},
		{"a renewal of more than a batch", renewals(watchdog.Batch+1, time.Second)},
		{"an election value over MaxMetadataLen", proclaimArgs{id: "vm/1/c-1", value: strings.Repeat("v", MaxMetadataLen+1),
			publish: "PUBLISH", seq: 1}.call(schema.ElectionKeys("redisync", "limits"))},
		{"a negative most waiters", acquireArgs{ticket: "vm/1/c-1", lease: time.Second, mode: "queue", heartbeat: time.Second,
			handoff: time.Second, publish: "PUBLISH", most: -1}.call(k)},
		{"most waiters not a whole number", scriptCall{acquireScript, []string{k.Hash, k.Queue, k.Bargers, k.Tombstone("vm/1/c-1")},
			[]any{"vm/1/c-1", 1000, "queue most=1.5", 1000, 1000, ""}}},
		{"most waiters not a number", scriptCall{acquireScript, []string{k.Hash, k.Queue, k.Bargers, k.Tombstone("vm/1/c-1")},
			[]any{"vm/1/c-1", 1000, "queue most=", 1000, 1000, ""}}},
		{"a multi-lock acquisition of more than MaxMultiNames", multiAcquire(MaxMultiNames + 1)},
		{"a multi-lock release of more than MaxMultiNames", multiRelease(MaxMultiNames + 1)},
	} {
		err := tc.call.run(ctx, rdb).Err()
		if !errors.Is(redisError(err), ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", tc.what, err)
		}
	}
	if keys := mr.Keys(); len(keys) != 0 {
		t.Errorf("calls beyond the limits wrote %q", keys)
	}
	// At the limits, the calls run.
	if err := acquire("queue", MaxLease, MaxLease, strings.Repeat("m", MaxMetadataLen)).run(ctx, rdb).Err(); err != nil {
		t.Errorf("an acquisition at the limits: %v", err)
	}
	if err := renewals(watchdog.Batch, MaxLease).run(ctx, rdb).Err(); err != nil {
		t.Errorf("a renewal of a whole batch at the longest lease: %v", err)
	}
	if err := multiAcquire(MaxMultiNames).run(ctx, rdb).Err(); err != nil {
		t.Errorf("a multi-lock acquisition of MaxMultiNames: %v", err)
	}
	if err := multiRelease(MaxMultiNames).run(ctx, rdb).Err(); err != nil {
		t.Errorf("a multi-lock release of MaxMultiNames: %v", err)
	}
}

// multiAcquire returns a call of multi_acquire.lua on n locks.
func multiAcquire(n int) scriptCall {
	return multiAcquireArgs{ticket: "vm/1/c-1", lease: time.Second}.call(manyLocks(n))
}

// multiRelease returns a call of multi_release.lua on n locks.
func multiRelease(n int) scriptCall {
	a := multiReleaseArgs{publish: "PUBLISH"}
	for range n {
		a.ids, a.tokens = append(a.ids, "vm/1/c-1"), append(a.tokens, 0)
	}
	return a.call(manyLocks(n))
}

// manyLocks returns the keys of n locks that share a slot.
func manyLocks(n int) []schema.Lock {
	ks := make([]schema.Lock, n)
	for i, name := range manyNames("multi-", n) {
		ks[i] = schema.LockKeys("redisync", name)
	}
	return ks
}

// manyNames returns n names that start with prefix.
func manyNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return names
}

// A MultiMutex of MaxMultiNames names takes them all, in one script call
// on one Redis, and releases them.
func TestMultiMutexAtMaxMultiNames(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMultiMutex(manyNames("at-max-", MaxMultiNames)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range m.Names() {
		if !lockHeld(t, mr, schema.LockKeys("redisync", name).Hash) {
			t.Fatalf("%s is not held", name)
		}
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range m.Names() {
		if lockHeld(t, mr, schema.LockKeys("redisync", name).Hash) {
			t.Fatalf("%s is still held", name)
		}
	}
}

// The first error kind in a script's error is its own: a key named after
// another kind does not change it.
func TestRedisErrorReadsTheScriptsOwnKind(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want error
	}{
		{"ERR user_script:1: WRONGTYPE redisync: p:lock:{LIMIT redisync: x} does not hold a lock", ErrWrongType},
		{"ERR user_function:1: WRONGTYPE redisync: p:lock:{LAYOUT redisync: x} does not hold a lock", ErrWrongType},
		{"ERR user_script:1: LIMIT redisync: the lease must be whole milliseconds from 1 to 86400000", ErrInvalidOption},
		{"ERR user_script:1: LAYOUT redisync: p:lock:{WRONGTYPE} was written in layout 2, this redisync reads layout 3", ErrLayout},
	} {
		err := redisError(replyError(tc.msg))
		for _, e := range []error{ErrWrongType, ErrInvalidOption, ErrLayout} {
			if errors.Is(err, e) != (e == tc.want) {
				t.Errorf("%q: errors.Is(%v) = %v", tc.msg, e, errors.Is(err, e))
			}
		}
	}
}

// A fair lock's queue holds at most WithMaxWaiters calls: the next Lock
// fails at once with ErrQueueFull, leaving nothing in Redis (no record,
// no tombstone, no heartbeat of its Client), while the queued calls get
// the lock in their order; once one has left, a Lock queues again.
func TestMutexQueueFullRefusesTheNextLock(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "full")
	// No renewals, and heartbeats every 20 s: none runs while the test
	// compares the state.
	opts := []Option{WithMaxWaiters(3), WithRecheck(time.Hour), WithWaiterTimeout(time.Minute), WithFixedLease(time.Minute)}
	holder := must(newClient(t, rdb, opts...).NewMutex("full"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	ws := make([]*Mutex, 3)
	done := make([]<-chan error, len(ws))
	for i := range ws {
		ws[i] = must(newClient(t, rdb, opts...).NewMutex("full"))
		done[i] = async(func() error { return ws[i].Lock(ctx) })
		eventually(t, 5*time.Second, "the waiter to queue", func() bool { return queueSize(mr, k.Queue) == i+1 })
	}
	before := mr.Dump()
	refused := newClient(t, rdb, opts...)
	late := must(refused.NewMutex("full"))
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := late.Lock(lctx)
	if !errors.Is(err, ErrQueueFull) || lctx.Err() != nil {
		t.Fatalf("Lock on a full queue: %v (ctx: %v), want ErrQueueFull at once", err, lctx.Err())
	}
	if !strings.Contains(err.Error(), `"full"`) {
		t.Errorf("the error %q does not name the lock", err)
	}
	if after := mr.Dump(); after != before {
		t.Fatalf("the refused Lock wrote:\n%s\nthen\n%s", before, after)
	}
	if ok, err := late.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock on a full queue: %v, %v; want false, nil", ok, err)
	}

	// In their order; the refused Client queues once there is room.
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done[0]); err != nil {
		t.Fatal(err)
	}
	again := async(func() error { return late.Lock(ctx) })
	eventually(t, 5*time.Second, "the refused Client's Lock to queue", func() bool { return queueSize(mr, k.Queue) == 3 })
	ws, done = append(ws, late), append(done, again)
	for i := range ws {
		if i > 0 {
			if err := result(t, done[i]); err != nil {
				t.Fatalf("waiter %d: %v", i, err)
			}
		}
		for j := i + 1; j < len(ws); j++ {
			pending(t, done[j], fmt.Sprintf("waiter %d, queued behind waiter %d", j, i))
		}
		if err := ws[i].Unlock(ctx); err != nil {
			t.Fatalf("waiter %d: %v", i, err)
		}
	}
	if n := queueSize(mr, k.Queue); n != 0 {
		t.Fatalf("%d records left in the queue", n)
	}
}

// A call refused by a full queue leaves nothing in Redis, whatever it
// found: acquire.lua replies {-4, most} before it writes anything of the
// call. A call already queued is never refused (its later attempts are
// not joins), nor a TryLock, which never joins; 0 is no limit.
func TestAcquireScriptQueueLimit(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		mr, rdb, _ := newMini(t)
		acquireQueueLimit(t, rdb, func() string { return mr.Dump() })
	})
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.NewClient(t, redistest.Spawn(t).Addr)
		acquireQueueLimit(t, rdb, func() string { return dump(t, rdb) })
	})
}

// dump returns every key of rdb's server with its type and content.
func dump(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, key := range keys {
		var v any
		switch typ := rdb.Type(ctx, key).Val(); typ {
		case "string":
			v = rdb.Get(ctx, key).Val()
		case "hash":
			v = rdb.HGetAll(ctx, key).Val() // printed with sorted keys
		case "list":
			v = rdb.LRange(ctx, key, 0, -1).Val()
		case "zset":
			v = rdb.ZRangeWithScores(ctx, key, 0, -1).Val()
		default:
			v = typ
		}
		fmt.Fprintf(&b, "%s: %v\n", key, v)
	}
	return b.String()
}

// acquireQueueLimit is TestAcquireScriptQueueLimit on rdb's server, whose
// keys and their content dump returns.
func acquireQueueLimit(t *testing.T, rdb *redis.Client, dump func() string) {
	k := schema.LockKeys("redisync", "most")
	attempt := func(ticket, mode string, most int, seq int64) ([]int64, error) {
		return acquireArgs{ticket: ticket, lease: time.Minute, mode: mode, heartbeat: time.Minute, seq: seq,
			handoff: time.Minute, publish: "PUBLISH", most: most}.call(k).run(ctx, rdb).Int64Slice()
	}
	if res, err := attempt("vm/1/c-1.h", "queue", 1, 0); err != nil || res[0] != 1 {
		t.Fatalf("the first attempt: %v, %v; want the lock", res, err)
	}
	queued, err := attempt("vm/1/c-2.a", "queue", 1, 0)
	if err != nil || len(queued) != 4 {
		t.Fatalf("the second attempt: %v, %v; want queued", queued, err)
	}
	before := dump()
	if res, err := attempt("vm/1/c-3.b", "queue", 1, 0); err != nil || len(res) != 2 || res[0] != -4 || res[1] != 1 {
		t.Fatalf("an attempt on a full queue: %v, %v; want {-4, 1}", res, err)
	}
	if after := dump(); after != before {
		t.Fatalf("the refused attempt wrote:\n%s\nthen\n%s", before, after)
	}
	if res, err := attempt("vm/1/c-2.a", "again", 1, queued[2]); err != nil || res[0] != 0 {
		t.Fatalf("the queued call's next attempt: %v, %v; want {0, ...}", res, err)
	}
	if res, err := attempt("vm/1/c-3.b", "try", 1, 0); err != nil || len(res) != 2 || res[0] != 0 {
		t.Fatalf("a TryLock on a full queue: %v, %v; want {0, ms}", res, err)
	}
	if res, err := attempt("vm/1/c-3.b", "queue", 0, 0); err != nil || len(res) != 4 {
		t.Fatalf("an attempt with no limit: %v, %v; want queued", res, err)
	}
	if res, err := attempt("vm/1/c-4.c", "queue", 3, 0); err != nil || len(res) != 4 {
		t.Fatalf("an attempt under a limit of 3: %v, %v; want queued", res, err)
	}
	if res, err := attempt("vm/1/c-5.d", "queue", 3, 0); err != nil || res[0] != -4 {
		t.Fatalf("an attempt on a queue of 3, at most 3: %v, %v; want {-4, 3}", res, err)
	}
}

// The queue's length is read only by an attempt that would join it: an
// uncontended Lock, its Unlock and a TryLock of a held lock make no LLEN;
// a waiter that queues makes one.
func TestMaxWaitersReadsTheQueueOnlyToJoin(t *testing.T) {
	rdb := redistest.NewClient(t, redistest.Spawn(t).Addr)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	llens := func() int {
		t.Helper()
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "cmdstat_llen:calls="); ok {
				n, _, _ := strings.Cut(v, ",")
				calls, err := strconv.Atoi(n)
				if err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				return calls
			}
		}
		return 0
	}
	m := must(c.NewMutex("llen"))
	for range 3 {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := must(c.NewMutex("llen")).TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock of a held lock: %v, %v", ok, err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := llens(); n != 0 {
		t.Fatalf("%d LLEN calls without a waiter, want none", n)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	w := must(c.NewMutex("llen"))
	done := async(func() error { return w.Lock(ctx) })
	eventually(t, 5*time.Second, "the waiter to queue", func() bool {
		return rdb.Exists(ctx, schema.LockKeys("redisync", "llen").Queue).Val() == 1
	})
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := llens(); n != 1 {
		t.Fatalf("%d LLEN calls for a waiter that queued once, want 1", n)
	}
}

// A MultiMutex one of whose names has a full queue fails with
// ErrQueueFull, holding none of its names and queued for none.
func TestMultiMutexQueueFull(t *testing.T) {
	mr, rdb, _ := newMini(t)
	opts := []Option{WithMaxWaiters(1), WithRecheck(time.Hour)}
	c := newClient(t, rdb, opts...)
	holder := must(c.NewMutex("b"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	w := must(c.NewMutex("b"))
	done := async(func() error { return w.Lock(ctx) })
	kb := schema.LockKeys("redisync", "b")
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return queueSize(mr, kb.Queue) == 1 })
	m := must(newClient(t, rdb, opts...).NewMultiMutex([]string{"a", "b"}))
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.Lock(lctx); !errors.Is(err, ErrQueueFull) || lctx.Err() != nil {
		t.Fatalf("Lock with a full queue on b: %v (ctx: %v), want ErrQueueFull at once", err, lctx.Err())
	}
	if ka := schema.LockKeys("redisync", "a"); lockHeld(t, mr, ka.Hash) || queueSize(mr, ka.Queue) != 0 {
		t.Fatal("the refused MultiMutex left a held or queued")
	}
	if n := queueSize(mr, kb.Queue); n != 1 {
		t.Fatalf("%d records in b's queue, want the waiter's alone", n)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
