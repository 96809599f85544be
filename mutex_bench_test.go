package redisync

import (
	"context"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Micro-benchmarks of the Mutex fast paths on a real Redis: the one given
// by REDIS_ADDR, or else a redis-server (from PATH) that each benchmark
// starts on a free loopback port and stops when it ends. Besides ns/op they
// report, per operation:
//
//	cmds/op   commands the client sent (an EVALSHA counts one), counted by a
//	          go-redis hook; connection handshakes are left out
//	calls/op  commands Redis executed, those run inside scripts included
//	          (INFO commandstats)
//	script-µs/op  time Redis spent running scripts and functions (the usec
//	          of FCALL, EVALSHA and EVAL in INFO commandstats)
//
// Run them with
//
//	go test -run '^$' -bench Mutex -benchtime 2s .
//
// The side-by-side comparison with other libraries is in bench/.

// BenchmarkMutexLockUnlock measures an uncontended Lock followed by Unlock:
// one acquire and one release script call. Two floors run beside it:
// "2xPING", two round trips that do nothing, and "SETNX+DEL", the
// simplest lock there is (SET NX PX, then a compare-and-delete script, as
// bsm/redislock and redsync do), which has no reentrancy, fencing token,
// fair queue, retry tombstone nor wake-up message. "observed" has an
// Observer that does nothing: the cost of telling one.
func BenchmarkMutexLockUnlock(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"barging", []Option{Barging()}},
		{"observed", []Option{WithObserver(nopObserver{})}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rdb, cnt := benchRedis(b)
			c := benchClient(b, rdb, tc.opts...)
			m := must(c.NewMutex(benchKey(b)))
			ctx := context.Background()
			run := func() {
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			run() // loads the scripts and opens the connection
			benchLoop(b, rdb, cnt, run)
		})
	}
	b.Run("2xPING", func(b *testing.B) {
		rdb, cnt := benchRedis(b)
		ctx := context.Background()
		run := func() {
			if err := rdb.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if err := rdb.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
		run()
		benchLoop(b, rdb, cnt, run)
	})
	b.Run("SETNX+DEL", func(b *testing.B) {
		rdb, cnt := benchRedis(b)
		ctx := context.Background()
		key, token := benchKey(b), "owner-token"
		run := func() {
			if ok, err := rdb.SetNX(ctx, key, token, 30*time.Second).Result(); err != nil || !ok {
				b.Fatalf("SET NX = %v, %v", ok, err)
			}
			if n, err := benchDelIfOwner.Run(ctx, rdb, []string{key}, token).Int(); err != nil || n != 1 {
				b.Fatalf("compare-and-delete = %v, %v", n, err)
			}
		}
		run()
		benchLoop(b, rdb, cnt, run)
	})
}

// nopObserver is an Observer that does nothing.
type nopObserver struct{}

func (nopObserver) CallStart(ctx context.Context, _ CallInfo) context.Context { return ctx }
func (nopObserver) CallEnd(context.Context, CallInfo)                         {}
func (nopObserver) Event(Event)                                               {}

// benchDelIfOwner is the release of the simplest lock: delete the key if
// it still holds the caller's token.
var benchDelIfOwner = testScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkMutexTryLockHeld measures TryLock on a lock another owner
// holds: one acquire script call that fails.
func BenchmarkMutexTryLockHeld(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"barging", []Option{Barging()}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rdb, cnt := benchRedis(b)
			c := benchClient(b, rdb)
			name := benchKey(b)
			ctx := context.Background()
			holder := must(c.NewMutex(name, tc.opts...))
			if err := holder.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = holder.Unlock(ctx) })
			m := must(c.NewMutex(name, tc.opts...))
			run := func() {
				ok, err := m.TryLock(ctx)
				if err != nil || ok {
					b.Fatalf("TryLock on a held lock = %v, %v; want false, nil", ok, err)
				}
			}
			run()
			benchLoop(b, rdb, cnt, run)
		})
	}
}

// BenchmarkMutexHandoff measures the hand-off of a lock between two
// Clients (two processes, each with its own connections and subscriber)
// that take turns: each holds the lock for handoffHold, then unlocks,
// which hands the lock to the other, queued meanwhile ("fair"), or wakes
// it to take the lock ("barging"). ns/handoff is the
// mean time from the call of Unlock in one to the return of Lock in the
// other (the bench's "gap"); an op is two turns. The "PUBLISH" case is the
// floor under it: the same turns passed by a PUBLISH that the other
// client's pub/sub connection reads.
func BenchmarkMutexHandoff(b *testing.B) {
	b.Run("fair", func(b *testing.B) { benchTurns(b) })
	b.Run("barging", func(b *testing.B) { benchTurns(b, Barging()) })
	b.Run("PUBLISH", benchPublishTurns)
}

// BenchmarkMutexWake times the passing of a lock to a waiting Lock of
// another Client, asleep on its channel (recorded in the queue, or as a
// barging waiter, and subscribed) when the holder's Unlock is sent: the
// hand-over, from the Unlock call to the waiter's Lock returning, and the
// wake-up, from the Unlock returning (a fair waiter, granted by the
// release script, may return first). Beside each it times two EVALSHA
// round trips in a row of a script that does nothing, on the waiter's
// go-redis client: the first after an idle millisecond, the second warm.
// It reports the medians, and the hand-over's and the wake-up's ratios to
// the warm round trip. A fair hand-over is the release's round trip, its
// grant's PUBLISH delivered on the way; a barging one, the release, a
// PUBLISH delivered, and the waiter's acquire round trip.
func BenchmarkMutexWake(b *testing.B) {
	b.Run("fair", func(b *testing.B) { benchWake(b) })
	b.Run("barging", func(b *testing.B) { benchWake(b, Barging()) })
}

func benchWake(b *testing.B, opts ...Option) {
	rdb1, cnt := benchRedis(b)
	rdb2 := benchSecondClient(b, rdb1, cnt)
	name := benchKey(b)
	c1, c2 := benchClient(b, rdb1), benchClient(b, rdb2)
	holder, waiter := must(c1.NewMutex(name, opts...)), must(c2.NewMutex(name, opts...))
	k := waiter.keys
	noop := testScript("return 1")
	ctx := context.Background()
	asleep := func() bool {
		var n int64
		if len(opts) == 0 {
			n = rdb1.LLen(ctx, k.Queue).Val() // the fair queue is a list
		} else {
			n = rdb1.Exists(ctx, k.Bargers).Val()
		}
		return n > 0 && confirmedWaiters(c2, k.Channel)+confirmedWaiters(c2, k.GrantChannel(c2.id)) > 0
	}
	var handovers, wakes, trips, warm []time.Duration
	for b.Loop() {
		b.StopTimer()
		if err := holder.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		got := make(chan error, 1)
		var woke time.Time
		go func() {
			err := waiter.Lock(ctx)
			woke = time.Now()
			got <- err
		}()
		deadline := time.Now().Add(10 * time.Second)
		for !asleep() {
			select {
			case err := <-got:
				b.Fatalf("the waiter's Lock returned before its release: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				b.Fatal("the waiter did not go to sleep within 10 s")
			}
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(time.Millisecond) // past the reply that recorded it
		start := time.Now()
		if err := noop.Run(ctx, rdb2, nil).Err(); err != nil {
			b.Fatal(err)
		}
		trips = append(trips, time.Since(start))
		start = time.Now()
		if err := noop.Run(ctx, rdb2, nil).Err(); err != nil {
			b.Fatal(err)
		}
		warm = append(warm, time.Since(start))
		b.StartTimer()
		unlock := time.Now()
		if err := holder.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		unlocked := time.Now()
		select {
		case err := <-got:
			if err != nil {
				b.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			b.Fatal("the waiter was not woken within 10 s of the release")
		}
		handovers = append(handovers, woke.Sub(unlock))
		wakes = append(wakes, woke.Sub(unlocked))
		b.StopTimer()
		if err := waiter.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	o, w, t, h := median(handovers), median(wakes), median(trips), median(warm)
	b.ReportMetric(o, "us/handover-p50")
	b.ReportMetric(w, "us/wake-p50")
	b.ReportMetric(t, "us/evalsha-p50")
	b.ReportMetric(h, "us/warm-evalsha-p50")
	b.ReportMetric(o/h, "handover/warm-evalsha")
	b.ReportMetric(w/h, "wake/warm-evalsha")
}

// benchTurns runs the turns of BenchmarkMutexHandoff with Mutexes made
// with opts.
func benchTurns(b *testing.B, opts ...Option) {
	rdb1, cnt := benchRedis(b)
	rdb2 := benchSecondClient(b, rdb1, cnt)
	name := benchKey(b)
	m1 := must(benchClient(b, rdb1).NewMutex(name, opts...))
	m2 := must(benchClient(b, rdb2).NewMutex(name, opts...))
	var gaps benchGaps
	turn := func(ctx context.Context, m *Mutex) error {
		if err := m.Lock(ctx); err != nil {
			return err
		}
		gaps.took()
		time.Sleep(handoffHold)
		gaps.release()
		return m.Unlock(context.Background())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // the other process
		defer close(done)
		for turn(ctx, m2) == nil {
		}
	}()
	b.Cleanup(func() { cancel(); <-done })
	run := func() {
		if err := turn(ctx, m1); err != nil {
			b.Fatal(err)
		}
	}
	run()
	gaps.reset()
	benchLoop(b, rdb1, cnt, run)
	gaps.report(b)
}

// benchPublishTurns is the floor under benchTurns: the same turns passed
// by a PUBLISH that the other client's pub/sub connection reads.
func benchPublishTurns(b *testing.B) {
	rdb1, cnt := benchRedis(b)
	rdb2 := benchSecondClient(b, rdb1, cnt)
	ctx := context.Background()
	ping, pong := benchKey(b)+":ping", benchKey(b)+":pong"
	ps1, ps2 := rdb1.Subscribe(ctx, pong), rdb2.Subscribe(ctx, ping)
	b.Cleanup(func() { _ = ps1.Close() })
	for _, ps := range []*redis.PubSub{ps1, ps2} {
		if _, err := ps.Receive(ctx); err != nil { // the confirmation
			b.Fatal(err)
		}
	}
	var gaps benchGaps
	turn := func(rdb *redis.Client, ps *redis.PubSub, to string) error {
		if _, err := ps.ReceiveMessage(ctx); err != nil {
			return err
		}
		gaps.took()
		time.Sleep(handoffHold)
		gaps.release()
		return rdb.Publish(ctx, to, "").Err()
	}
	done := make(chan struct{})
	go func() { // the other process
		defer close(done)
		for turn(rdb2, ps2, pong) == nil {
		}
	}()
	b.Cleanup(func() { _ = ps2.Close(); <-done }) // runs first
	if err := rdb1.Publish(ctx, ping, "").Err(); err != nil {
		b.Fatal(err)
	}
	run := func() {
		if err := turn(rdb1, ps1, ping); err != nil {
			b.Fatal(err)
		}
	}
	run()
	gaps.reset()
	benchLoop(b, rdb1, cnt, run)
	gaps.report(b)
}

// handoffHold is how long a holder keeps the lock in BenchmarkMutexHandoff:
// long enough for the other to be queued again when it is handed over.
const handoffHold = time.Millisecond

// benchGaps measures hand-offs: from release, when one side is about to
// give the lock up, to took, when the other has it.
type benchGaps struct {
	released    atomic.Int64 // UnixNano of the last release; 0: none yet
	sum, handed atomic.Int64
}

func (g *benchGaps) release() { g.released.Store(time.Now().UnixNano()) }

func (g *benchGaps) took() {
	if r := g.released.Load(); r != 0 {
		g.sum.Add(time.Now().UnixNano() - r)
		g.handed.Add(1)
	}
}

func (g *benchGaps) reset() { g.sum.Store(0); g.handed.Store(0) }

func (g *benchGaps) report(b *testing.B) {
	if n := g.handed.Load(); n > 0 {
		b.ReportMetric(float64(g.sum.Load())/float64(n), "ns/handoff")
	}
}

// benchSecondClient returns another go-redis client to rdb's server,
// counting in cnt: a second process.
func benchSecondClient(b *testing.B, rdb *redis.Client, cnt *benchCounter) *redis.Client {
	b.Helper()
	rdb2 := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	addHook(rdb2, cnt)
	b.Cleanup(func() { _ = rdb2.Close() })
	return rdb2
}

// benchLoop times op with b.Loop and reports the commands sent and
// executed per op.
func benchLoop(b *testing.B, rdb *redis.Client, cnt *benchCounter, op func()) {
	b.Helper()
	ctx := context.Background()
	before := benchParseInfo(b, benchInfo(b, ctx, rdb, "commandstats"))
	sent0 := cnt.n.Load()
	n := 0
	for b.Loop() {
		op()
		n++
	}
	sent := cnt.n.Load() - sent0
	after := benchParseInfo(b, benchInfo(b, ctx, rdb, "commandstats"))
	calls := after.calls - before.calls - 1 // the first INFO
	var script float64
	for _, name := range []string{"fcall", "evalsha", "eval"} {
		script += after.usec[name] - before.usec[name]
	}
	b.ReportMetric(float64(sent)/float64(n), "cmds/op")
	b.ReportMetric(float64(calls)/float64(n), "calls/op")
	b.ReportMetric(script/float64(n), "script-µs/op")
}

// benchStats are a Redis server's cumulative figures at one instant.
type benchStats struct {
	calls int64              // commands executed, the ones run by scripts included
	usec  map[string]float64 // time spent in each command, by name (commandstats)
	cpu   float64            // used_cpu_user + used_cpu_sys, in µs
	sys   float64            // used_cpu_sys, in µs
}

// benchServer reads the server's figures with INFO commandstats, then INFO
// cpu (one section each: Redis 6 takes no more), sent past the counting
// hook.
func benchServer(b *testing.B, ctx context.Context, rdb *redis.Client) benchStats {
	b.Helper()
	return benchParseInfo(b, benchInfo(b, ctx, rdb, "commandstats")+"\n"+benchInfo(b, ctx, rdb, "cpu"))
}

// benchInfo returns INFO section, sent past the counting hook.
func benchInfo(b *testing.B, ctx context.Context, rdb *redis.Client, section string) string {
	b.Helper()
	info, err := rdb.Info(benchUncounted(ctx), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	return info
}

// benchParseInfo reads benchStats from INFO's text.
func benchParseInfo(b *testing.B, info string) benchStats {
	b.Helper()
	s := benchStats{usec: map[string]float64{}}
	for _, line := range strings.Split(info, "\n") {
		key, value, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case key == "used_cpu_user" || key == "used_cpu_sys":
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				b.Fatalf("INFO cpu %q: %v", line, err)
			}
			s.cpu += v * 1e6
			if key == "used_cpu_sys" {
				s.sys += v * 1e6
			}
		case strings.HasPrefix(key, "cmdstat_"):
			for _, field := range strings.Split(value, ",") {
				name, v, _ := strings.Cut(field, "=")
				n, err := strconv.ParseFloat(v, 64)
				if (name == "calls" || name == "usec") && err != nil {
					b.Fatalf("commandstats %q: %v", line, err)
				}
				switch name {
				case "calls":
					s.calls += int64(n)
				case "usec":
					s.usec[strings.TrimPrefix(key, "cmdstat_")] = n
				}
			}
		}
	}
	return s
}

// benchClient returns a redisync Client closed when the benchmark ends.
func benchClient(b *testing.B, rdb redis.UniversalClient, opts ...Option) *Client {
	b.Helper()
	c, err := New(rdb, append([]Option{withHooksOf(rdb)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// benchKey returns a lock name unique to this benchmark run.
func benchKey(b *testing.B) string {
	return "bench:" + b.Name() + ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// benchRedis returns a go-redis client, closed at the end of the
// benchmark, that counts what it sends: to REDIS_ADDR if set (flushing
// nothing: benchmarks use keys of their own), else to a redis-server
// started for this benchmark. It skips the benchmark when neither is
// available.
func benchRedis(b *testing.B) (*redis.Client, *benchCounter) {
	b.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = benchStartServer(b)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	cnt := &benchCounter{}
	addHook(rdb, cnt)
	b.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(benchUncounted(context.Background())).Err(); err != nil {
		b.Fatalf("redis at %s: %v", addr, err)
	}
	return rdb, cnt
}

// benchStartServer starts redis-server without persistence on a free
// loopback port, stopped when the benchmark ends, and returns its address.
func benchStartServer(b *testing.B) string {
	b.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		b.Skip("redis-server is not on PATH and REDIS_ADDR is not set: skipping the benchmarks that need Redis")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := b.TempDir()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		b.Fatalf("start redis-server: %v", err)
	}
	b.Cleanup(func() { // runs before TempDir's clean-up
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = conn.Close()
			return addr
		}
		if time.Now().After(deadline) {
			b.Fatalf("redis-server on %s did not start: %v", addr, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// benchCounter is a go-redis hook that counts the commands sent, except
// a new connection's handshake and the commands of a context marked by
// benchUncounted.
type benchCounter struct {
	passDial
	n atomic.Int64
}

type benchUncountedKey struct{}

// benchUncounted marks ctx so that benchCounter does not count its
// commands: the benchmark's own measurements.
func benchUncounted(ctx context.Context) context.Context {
	return context.WithValue(ctx, benchUncountedKey{}, true)
}

func (c *benchCounter) counts(ctx context.Context, cmd redis.Cmder) bool {
	if ctx.Value(benchUncountedKey{}) != nil {
		return false
	}
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return false
	}
	return true
}

func (c *benchCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.counts(ctx, cmd) {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *benchCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if c.counts(ctx, cmd) {
				c.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}
