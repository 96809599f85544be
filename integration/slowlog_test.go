package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// The lock scripts bound their work per call, whatever others leave in a
// lock's queue (scripts/lock_lib.lua: drop_max records dropped per call,
// wake_max, scan_max): on a Redis shared by many applications no call of
// redisync may block the server for long. These tests leave 10,000
// records in a fair lock's queue that no live waiter owns, and fail if
// the server's SLOWLOG shows a script call of redisync that ran over
// scriptBudget, or if the live waiters behind them are not served, in
// order.
//
// The SLOWLOG gives a command's time by the wall clock: a call during
// which the server's main thread was preempted by another process (the
// test's own client under -race, other tests: the project's test machine
// has 2 cores) runs that much longer by it, whatever its work; on that
// machine about one call in a few hundred, by 1 to 6 ms. A run of a test
// fails when a script's median call (the calls of a script do the same
// bounded work), or any call, ran over the budget by more than the main
// thread waited for a CPU in the whole run (Linux's schedstat; no wait is
// known elsewhere), which no preemption explains. Calls and medians over
// the budget by less are logged, and the test runs again, up to
// budgetRuns times, for a run without any.

// scriptBudget is the longest a script call of redisync may run.
const scriptBudget = time.Millisecond

// budgetRuns is how many times a test runs while its runs have calls over
// the budget that preemption explains (see above).
const budgetRuns = 3

// deadRecords is how many records the tests leave ahead of live waiters.
const deadRecords = 10_000

// slowlogServer starts a redis-server of the test's own, so that its
// SLOWLOG holds the test's commands only, and returns an admin client of
// it. The SLOWLOG logs every command (threshold 0, so that the worst
// script call is known, not only those over the budget) and keeps
// enough entries for the whole test; the settings are restored at the
// end of the test.
func slowlogServer(t *testing.T) (addr string, rdb *redis.Client) {
	t.Helper()
	srv := redistest.Spawn(t)
	rdb = redistest.NewClient(t, srv.Addr)
	was, err := rdb.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range []string{"slowlog-log-slower-than", "slowlog-max-len"} {
			if err := rdb.ConfigSet(context.Background(), p, was[p]).Err(); err != nil {
				t.Errorf("restoring %s: %v", p, err)
			}
		}
	})
	if err := rdb.ConfigSet(ctx, "slowlog-max-len", "1000000").Err(); err != nil {
		t.Fatal(err)
	}
	return srv.Addr, rdb
}

// resetSlowlog starts the SLOWLOG anew, logging every command. It
// returns a function that describes the server's main thread's time since
// (see schedSince).
func resetSlowlog(t *testing.T, rdb *redis.Client) func() sched {
	t.Helper()
	since := schedSince(t, rdb)
	if err := rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, "SLOWLOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	return since
}

// sched is the time the main thread of a server spent on a CPU, and
// waiting for one (preempted by other processes: a script call it
// interrupts runs that much longer by the SLOWLOG).
type sched struct {
	cpu, wait time.Duration
	known     bool // false where Linux's /proc/PID/schedstat is not found
}

// String describes s.
func (s sched) String() string {
	if !s.known {
		return "the server's main thread's time is not known"
	}
	return fmt.Sprintf("the server's main thread ran %v and waited %v for a CPU", s.cpu.Round(time.Microsecond), s.wait.Round(time.Microsecond))
}

// schedSince returns a function that returns the sched of the main thread
// of rdb's server since schedSince was called.
func schedSince(t *testing.T, rdb *redis.Client) func() sched {
	t.Helper()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	var pid string
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid = v
		}
	}
	read := func() (cpu, wait time.Duration, ok bool) {
		b, err := os.ReadFile("/proc/" + pid + "/schedstat")
		f := strings.Fields(string(b))
		if err != nil || len(f) < 2 {
			return 0, 0, false
		}
		c, err1 := strconv.ParseInt(f[0], 10, 64)
		w, err2 := strconv.ParseInt(f[1], 10, 64)
		return time.Duration(c), time.Duration(w), err1 == nil && err2 == nil
	}
	cpu0, wait0, ok0 := read()
	return func() sched {
		cpu, wait, ok := read()
		return sched{cpu: cpu - cpu0, wait: wait - wait0, known: ok0 && ok}
	}
}

// slowScripts is what the SLOWLOG says of redisync's script calls.
type slowScripts struct {
	n     int                        // script calls logged
	worst redis.SlowLog              // the longest
	over  []redis.SlowLog            // those over scriptBudget
	by    map[string][]time.Duration // the calls' times, by script (function name or SHA)
}

// readSlowlog reads the script calls in the SLOWLOG since resetSlowlog,
// and fails t if entries were dropped.
func readSlowlog(t *testing.T, rdb *redis.Client) slowScripts {
	t.Helper()
	return readSlowlogOf(t, rdb, isScript)
}

// isScript reports whether e is a script call.
func isScript(e redis.SlowLog) bool {
	switch strings.ToLower(e.Args[0]) {
	case "fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro":
		return len(e.Args) > 1
	}
	return false
}

// notAdmin reports whether e is not one of the tests' own looks at the
// server (CONFIG, SLOWLOG, INFO).
func notAdmin(e redis.SlowLog) bool {
	switch strings.ToLower(e.Args[0]) {
	case "config", "slowlog", "info":
		return false
	}
	return true
}

// readSlowlogOf reads the commands in the SLOWLOG since resetSlowlog for
// which match is true, as readSlowlog reads the script calls.
func readSlowlogOf(t *testing.T, rdb *redis.Client, match func(redis.SlowLog) bool) slowScripts {
	t.Helper()
	n, err := rdb.Do(ctx, "SLOWLOG", "LEN").Int64()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rdb.ConfigGet(ctx, "slowlog-max-len").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strconv.FormatInt(n, 10) == cfg["slowlog-max-len"] {
		t.Fatalf("the SLOWLOG is full (%d entries): some may have been dropped", n)
	}
	log, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	sc := slowScripts{by: map[string][]time.Duration{}}
	for _, e := range log {
		if len(e.Args) == 0 || !match(e) {
			continue
		}
		sc.n++
		name := scriptName(e)
		sc.by[name] = append(sc.by[name], e.Duration)
		if e.Duration > sc.worst.Duration {
			sc.worst = e
		}
		if e.Duration > scriptBudget {
			sc.over = append(sc.over, e)
		}
	}
	return sc
}

// budgeted runs scenario, which returns what the SLOWLOG says of its
// script calls and the main thread's time, and logs them; it judges each
// run as the comment above says.
func budgeted(t *testing.T, what string, scenario func(t *testing.T) (slowScripts, sched)) {
	t.Helper()
	for run := 1; run <= budgetRuns; run++ {
		sc, s := scenario(t)
		name := fmt.Sprintf("%s, run %d", what, run)
		sc.log(t, name, s)
		typical, medianOver := sc.typical(t, name, s)
		if t.Failed() || !typical || (len(sc.over) == 0 && !medianOver) {
			return
		}
		explained := true
		for _, e := range sc.over {
			if s.known && e.Duration-scriptBudget <= s.wait {
				t.Logf("%s: a script call ran %v, over %v by less than the main thread waited for a CPU: %s",
					name, e.Duration, scriptBudget, scriptName(e))
				continue
			}
			explained = false
			t.Errorf("%s: a script call ran %v, over %v by more than the main thread waited for a CPU (%v): %s",
				name, e.Duration, scriptBudget, s.wait, scriptName(e))
		}
		if !explained {
			return
		}
	}
	t.Logf("%s: every one of %d runs had calls over %v, each by less than the main thread waited for a CPU in its run",
		what, budgetRuns, scriptBudget)
}

// typical fails t, and reports false, when the median call of a script
// ran over scriptBudget by more than the main thread waited for a CPU in
// the run s; over reports whether a median ran over it by less (a run
// with one or a few calls of a script, one of them preempted).
func (sc slowScripts) typical(t *testing.T, what string, s sched) (ok, over bool) {
	t.Helper()
	ok = true
	for name, ds := range sc.by {
		m := median(ds)
		switch {
		case m <= scriptBudget:
		case s.known && m-scriptBudget <= s.wait:
			t.Logf("%s: %s's median call ran %v, over %v by less than the main thread waited for a CPU",
				what, name, m, scriptBudget)
			over = true
		default:
			t.Errorf("%s: %s's median call ran %v, over %v by more than the main thread waited for a CPU (%v)",
				what, name, m, scriptBudget, s.wait)
			ok = false
		}
	}
	return ok, over
}

// median returns the median of ds.
func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// scriptName returns the function's name or the script's SHA of a script
// call e, "EVAL" for the source of one, or the command's name.
func scriptName(e redis.SlowLog) string {
	if !isScript(e) || len(e.Args[1]) > 40 {
		return strings.ToUpper(e.Args[0])
	}
	return e.Args[1]
}

// log logs the calls' times, and the main thread's time s; it fails t
// when there were none.
func (sc slowScripts) log(t *testing.T, what string, s sched) {
	t.Helper()
	if sc.n == 0 {
		t.Fatalf("%s: no call in the SLOWLOG", what)
	}
	names := make([]string, 0, len(sc.by))
	for name, ds := range sc.by {
		slices.Sort(ds)
		names = append(names, fmt.Sprintf("%s: %d calls, median %v, 99th percentile %v, longest %v",
			name, len(ds), ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]))
	}
	slices.Sort(names)
	t.Logf("%s: %d calls, the longest %v (%s); by script or command: %s; %s",
		what, sc.n, sc.worst.Duration, scriptName(sc.worst), strings.Join(names, "; "), s)
}

// plantQueue appends recs to the fair queue of the lock k as if they had
// joined it (scripts/lock_lib.lua, join): the hash's {queue} counts them
// and its {seq} numbers them. The records of dead Clients' waiters are
// numbered in order; recs holds "%d" where the number goes, or none (a
// record that is not redisync's). clients are Client fields set with
// their values.
func plantQueue(t *testing.T, rdb *redis.Client, k schema.Lock, recs []string, clients ...any) {
	t.Helper()
	seq, err := rdb.HGet(ctx, k.Hash, schema.SeqField).Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	list := make([]any, len(recs))
	for i, r := range recs {
		if strings.Contains(r, "%d") {
			seq++
			r = fmt.Sprintf(r, seq)
		}
		list[i] = r
	}
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i := 0; i < len(list); i += 1000 {
			p.RPush(ctx, k.Queue, list[i:min(i+1000, len(list))]...)
		}
		p.HIncrBy(ctx, k.Hash, schema.QueueField, int64(len(list)))
		p.HSet(ctx, k.Hash, schema.SeqField, seq)
		if len(clients) > 0 {
			p.HSet(ctx, k.Hash, clients...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// deadClient is the id of the dead Client whose waiters' records the
// tests leave: a UUID, as every Client's.
const deadClient = "5f0c2a9e-7d41-4b8a-9e3c-0d6b1f2a8c47"

// deadRecord returns the record of a waiter of deadClient whose heartbeat
// ran out a minute ago, with "%d" for its number. Its ticket is of the
// size of a real one: a label host/pid, the Client id, the call's number
// and 96 random bits in hex.
func deadRecord(i int, now time.Time) string {
	ticket := fmt.Sprintf("worker-host-17/4242/%s-%d.%024x", deadClient, i+1, uint64(i)*0x9e3779b97f4a7c15)
	r := schema.QueueRecord{Ticket: ticket, Joined: now.Add(-2 * time.Minute).UnixMilli(),
		Deadline: now.Add(-time.Minute).UnixMilli(), Handoff: 1000}.String()
	return "%d" + strings.TrimPrefix(r, "0")
}

// queueBehind starts a Lock of each of ms, in order, each once the one
// before has queued (the queue's length grows by one), and returns the
// channel on which each sends its index once it holds the lock; it then
// unlocks. A Lock that fails fails t. The test waits for the Locks to
// return when it ends.
func queueBehind(t *testing.T, ctx context.Context, rdb *redis.Client, k schema.Lock, ms []*redisync.Mutex) <-chan int {
	t.Helper()
	got := make(chan int, len(ms))
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	for i, m := range ms {
		n := rdb.LLen(ctx, k.Queue).Val()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.Lock(ctx); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			got <- i
			if err := m.Unlock(context.Background()); err != nil {
				t.Errorf("waiter %d: Unlock: %v", i, err)
			}
		}()
		eventually(t, 10*time.Second, fmt.Sprintf("waiter %d to queue", i), func() bool {
			return rdb.LLen(ctx, k.Queue).Val() == n+1
		})
	}
	return got
}

// served fails t unless the waiters behind got are served in order, each
// within d; it returns how long the first took from start.
func served(t *testing.T, got <-chan int, n int, start time.Time, d time.Duration) time.Duration {
	t.Helper()
	var first time.Duration
	for want := range n {
		select {
		case i := <-got:
			if i != want {
				t.Fatalf("waiter %d served as the %d-th: not in the order they queued", i, want+1)
			}
			if want == 0 {
				first = time.Since(start)
			}
		case <-time.After(d):
			t.Fatalf("waiter %d not served within %v", want, d)
		}
	}
	return first
}

// TestSlowlogLockQueueOfJunkAndDeadRecords leaves 10,000 records behind a
// fair lock's holder, half of them strings that are not redisync's
// records and half those of a dead Client's waiters (its own deadline
// and its Client's in the past), then queues three live waiters behind
// them and releases. It fails if a script call ran over 1 ms by the
// server's SLOWLOG (each call drops at most drop_max records), if the
// live waiters are not served, or not in the order they queued.
func TestSlowlogLockQueueOfJunkAndDeadRecords(t *testing.T) {
	budgeted(t, "junk and dead records", junkAndDeadRecords)
}

// junkAndDeadRecords is TestSlowlogLockQueueOfJunkAndDeadRecords's
// scenario.
func junkAndDeadRecords(t *testing.T) (slowScripts, sched) {
	addr, rdb := slowlogServer(t)
	name := redistest.Name(t)
	holderC := newClientOf(t, addr)
	holder := must(holderC.NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	k := schema.LockKeys(schema.DefaultPrefix, name)
	now := time.Now()
	recs := make([]string, deadRecords)
	for i := range recs {
		if i%2 == 0 {
			recs[i] = fmt.Sprintf("not a record of redisync %d", i)
		} else {
			recs[i] = deadRecord(i, now)
		}
	}
	plantQueue(t, rdb, k, recs, schema.ClientField(deadClient+"-1"), strconv.FormatInt(now.Add(-time.Minute).UnixMilli(), 10))

	since := resetSlowlog(t, rdb)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var ws []*redisync.Mutex
	for range 3 {
		ws = append(ws, must(newClientOf(t, addr).NewMutex(name, unlimited)))
	}
	got := queueBehind(t, wctx, rdb, k, ws)
	start := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	first := served(t, got, len(ws), start, time.Minute)
	t.Logf("the first live waiter, behind %d records that are not redisync's or dead, got the lock %v after the holder's Unlock",
		deadRecords, first.Round(time.Millisecond))
	if n := rdb.LLen(ctx, k.Queue).Val(); n != 0 {
		t.Errorf("%d records left in the queue", n)
	}
	return readSlowlog(t, rdb), since()
}

// TestSlowlogLockQueueOfADeadClient leaves 10,000 waiters' records of one
// Client that died (its heartbeat stopped a minute ago, without its
// waiters withdrawing: the records of a process killed while 10,000 of
// its goroutines waited, planted directly rather than made by 10,000
// goroutines, which this test's machine does not afford), then queues a
// live waiter behind them, and Locks and Unlocks the lock again and again
// from another, barging, Mutex: each Unlock hands the lock on to the
// first live waiter, dropping dead records on its way. It fails if a
// script call ran over 1 ms by the server's SLOWLOG, or if the live
// waiter is not served.
func TestSlowlogLockQueueOfADeadClient(t *testing.T) {
	budgeted(t, "a dead Client's records", deadClientRecords)
}

// deadClientRecords is TestSlowlogLockQueueOfADeadClient's scenario.
func deadClientRecords(t *testing.T) (slowScripts, sched) {
	addr, rdb := slowlogServer(t)
	name := redistest.Name(t)
	other := must(newClientOf(t, addr).NewMutex(name, redisync.Barging()))
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	k := schema.LockKeys(schema.DefaultPrefix, name)
	now := time.Now()
	recs := make([]string, deadRecords)
	for i := range recs {
		recs[i] = deadRecord(i, now)
	}
	plantQueue(t, rdb, k, recs, schema.ClientField(deadClient+"-1"), strconv.FormatInt(now.Add(-time.Minute).UnixMilli(), 10))

	since := resetSlowlog(t, rdb)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	got := queueBehind(t, wctx, rdb, k, []*redisync.Mutex{must(newClientOf(t, addr).NewMutex(name, unlimited))})
	start := time.Now()
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	unlocks := 1
	var first time.Duration
	for first == 0 {
		select {
		case <-got:
			first = time.Since(start)
			continue
		default:
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("the live waiter not served within a minute (%d Unlocks)", unlocks)
		}
		lctx, lcancel := context.WithTimeout(wctx, 10*time.Second)
		err := other.Lock(lctx)
		lcancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		unlocks++
	}
	t.Logf("the live waiter, behind %d records of a dead Client, got the lock %v after the first Unlock; %d Unlocks",
		deadRecords, first.Round(time.Millisecond), unlocks)
	return readSlowlog(t, rdb), since()
}

// newClientOf returns a redisync Client on a go-redis client of its own
// to addr, closed at the end of the test.
// unlimited lets a waiter queue behind the 10,000 records the tests plant,
// which count towards a lock's queue limit (WithMaxWaiters).
var unlimited = redisync.WithMaxWaiters(0)

func newClientOf(t *testing.T, addr string) *redisync.Client {
	t.Helper()
	c, err := redisync.New(redistest.NewClient(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestSlowlogLockWithdrawalBehindDeadRecords queues a live waiter behind
// 10,000 records of a dead Client, then has it give up (its context
// ends): its withdrawal takes its record out of the queue (LREM, which
// reads the list from its head to the record). It fails if that script
// call ran over 1 ms by the server's SLOWLOG. A first waiter withdraws
// the same way before, unmeasured but logged: a Client sends the
// withdrawal as a script (EVALSHA, then EVAL when the server does not
// have it), whose first EVAL on a server compiles the script, a cost of
// its size, not of the queue's.
func TestSlowlogLockWithdrawalBehindDeadRecords(t *testing.T) {
	budgeted(t, "a withdrawal behind a dead Client's records", withdrawalBehindDeadRecords)
}

// withdrawalBehindDeadRecords is
// TestSlowlogLockWithdrawalBehindDeadRecords's scenario.
func withdrawalBehindDeadRecords(t *testing.T) (slowScripts, sched) {
	addr, rdb := slowlogServer(t)
	name := redistest.Name(t)
	holder := must(newClientOf(t, addr).NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	k := schema.LockKeys(schema.DefaultPrefix, name)
	now := time.Now()
	recs := make([]string, deadRecords)
	for i := range recs {
		recs[i] = deadRecord(i, now)
	}
	plantQueue(t, rdb, k, recs, schema.ClientField(deadClient+"-1"), strconv.FormatInt(now.Add(-time.Minute).UnixMilli(), 10))

	withdraw := func() {
		t.Helper()
		wctx, cancel := context.WithCancel(ctx)
		w := must(newClientOf(t, addr).NewMutex(name, unlimited))
		done := make(chan error, 1)
		go func() { done <- w.Lock(wctx) }()
		eventually(t, 10*time.Second, "the waiter to queue", func() bool {
			return rdb.LLen(ctx, k.Queue).Val() == deadRecords+1
		})
		cancel()
		if err := <-done; err == nil {
			t.Fatal("Lock took the lock from its holder")
		}
		eventually(t, 10*time.Second, "the waiter's record to leave the queue", func() bool {
			return rdb.LLen(ctx, k.Queue).Val() == deadRecords
		})
	}
	since := resetSlowlog(t, rdb)
	withdraw()
	first := readSlowlog(t, rdb)
	first.log(t, "the first withdrawal (not held to the budget)", since())

	since = resetSlowlog(t, rdb)
	withdraw()
	sc, s := readSlowlog(t, rdb), since()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	return sc, s
}

// TestSlowlogInspectOfLongQueues reads a lock and a semaphore, each with
// 10,000 live waiters of as many Clients, on a server where another
// application subscribes to 10,000 channels, with InspectLock and
// InspectSemaphore: each reads a page (redisync.InspectPage) of each
// list, the records that page names, the lists' lengths, and the
// subscribers of the page's Clients' grant channels. It fails if a
// command of theirs ran over 1 ms by the server's SLOWLOG, or if what
// they return is not the first page in order with the totals. It logs,
// for comparison, what reading the same keys whole costs (HGETALL, LRANGE
// and ZRANGE of everything, and PUBSUB CHANNELS, as Inspect did before it
// read a page).
func TestSlowlogInspectOfLongQueues(t *testing.T) {
	budgeted(t, "Inspect of 10,000 waiters", inspectLongQueues)
}

// inspectLongQueues is TestSlowlogInspectOfLongQueues's scenario.
func inspectLongQueues(t *testing.T) (slowScripts, sched) {
	addr, rdb := slowlogServer(t)
	c := newClientOf(t, addr)
	name := redistest.Name(t)
	m := must(c.NewMutex(name))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	k := schema.LockKeys(schema.DefaultPrefix, name)
	sk := schema.SemaphoreKeys(schema.DefaultPrefix, name)
	now := time.Now()
	alive := strconv.FormatInt(now.Add(time.Minute).UnixMilli(), 10)
	recs := make([]string, deadRecords)
	var clients, waiters []any
	var queue []redis.Z
	for i := range recs {
		id := fmt.Sprintf("%s-%08d", deadClient[:27], i) // a Client id of a UUID's size
		ticket := fmt.Sprintf("worker-host-17/4242/%s-%d.%024x", id, i+1, uint64(i)*0x9e3779b97f4a7c15)
		r := schema.QueueRecord{Ticket: ticket, Joined: now.UnixMilli(), Deadline: now.Add(time.Minute).UnixMilli(), Handoff: 1000}.String()
		recs[i] = "%d" + strings.TrimPrefix(r, "0")
		clients = append(clients, schema.ClientField(ticket), alive)
		wid := ticket + "#" + strconv.Itoa(i+1)
		queue = append(queue, redis.Z{Score: float64(now.UnixMicro() + int64(i)), Member: wid})
		waiters = append(waiters, wid, alive+":1000:1:"+strconv.Itoa(i+1), schema.ClientField(wid), alive)
	}
	plantQueue(t, rdb, k, recs, clients...)
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, sk.Hash, "{size}", "1:"+strconv.Itoa(schema.SemLayout), "holder/"+deadClient+"-1.0", "1:1", schema.SemUsedField, "1:"+strconv.Itoa(schema.SemLayout))
		p.ZAdd(ctx, sk.Expiry, redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "holder/" + deadClient + "-1.0"})
		p.ZAdd(ctx, sk.Queue, queue...)
		p.HSet(ctx, sk.Hash, waiters...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Another application's 10,000 channels on the same server.
	ps := redistest.NewClient(t, addr).Subscribe(ctx)
	defer ps.Close()
	for i := 0; i < deadRecords; i += 1000 {
		var chans []string
		for j := i; j < i+1000; j++ {
			chans = append(chans, fmt.Sprintf("another-app:events:%d", j))
		}
		if err := ps.Subscribe(ctx, chans...); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "the other application's channels", func() bool {
		return len(rdb.PubSubChannels(ctx, "another-app:*").Val()) == deadRecords
	})

	// What reading everything costs.
	since := resetSlowlog(t, rdb)
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HGetAll(ctx, k.Hash)
		p.LRange(ctx, k.Queue, 0, -1)
		p.HGetAll(ctx, sk.Hash)
		p.ZRangeWithScores(ctx, sk.Queue, 0, -1)
		p.PubSubChannels(ctx, k.Channel+":*")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	whole := readSlowlogOf(t, rdb, notAdmin)
	whole.log(t, "reading the keys whole (not held to the budget)", since())

	since = resetSlowlog(t, rdb)
	st, err := c.InspectLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := c.InspectSemaphore(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sc := readSlowlogOf(t, rdb, notAdmin)
	if st.QueueLen != deadRecords || len(st.Queue) != redisync.InspectPage || ss.QueueLen != deadRecords || len(ss.Queue) != redisync.InspectPage {
		t.Fatalf("lock: %d of %d listed; semaphore: %d of %d; want %d of %d",
			len(st.Queue), st.QueueLen, len(ss.Queue), ss.QueueLen, redisync.InspectPage, deadRecords)
	}
	for i := range redisync.InspectPage {
		if w := st.Queue[i]; !w.Alive || !strings.HasSuffix(w.ID, fmt.Sprintf("%08d-%d.%024x", i, i+1, uint64(i)*0x9e3779b97f4a7c15)) {
			t.Fatalf("lock: Queue[%d] = %+v", i, w)
		}
		if w := ss.Queue[i]; !w.Alive || !strings.HasSuffix(w.ID, "#"+strconv.Itoa(i+1)) || w.Permits != 1 {
			t.Fatalf("semaphore: Queue[%d] = %+v", i, w)
		}
	}
	return sc, since()
}
