package redisync

import (
	"context"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// BenchmarkScriptCost measures where an uncontended Lock+Unlock's Redis
// time goes, on a real Redis (see mutex_bench_test.go), by running beside
// it the same two requests (the same keys and arguments) to scripts that
// do less:
//
//	return       a script that only returns: what any two script calls
//	             with these arguments cost
//	state read   a script that reads a lock's state as the acquire does
//	             (HMGET of its hash's 12 fields, then TIME) and returns:
//	             what those calls cost, without lib.lua
//	lib.lua      lib.lua's definitions, then return: what every script
//	             sent with EVALSHA pays before its first line (a function
//	             of the library finds them defined)
//	Lock+Unlock  the Mutex's acquire and release, as it sends them (FCALL
//	             on a server with functions)
//
// Besides ns/op it reports, per operation, from INFO commandstats and cpu:
//
//	exec-µs/op   time Redis spent running the scripts, the commands they
//	             call included (the usec of FCALL, EVALSHA and EVAL)
//	cmd-µs/op    of which, the commands the scripts call (their own usec)
//	cpu-µs/op    Redis's CPU time (used_cpu_user + used_cpu_sys): exec
//	             plus reading the requests and writing the replies
//	sys-µs/op    of which, the kernel's part (used_cpu_sys)
//
// A rung's difference from "return" is what it adds. The three replays
// send the same requests and get the same reply, so their CPU should
// differ by their exec; it differs by more, because Linux splits a
// process's CPU into user and system time by sampling it at each timer
// tick (4 ms at 250 Hz): exec is the figure to price a rung with, and
// the CPU figures are coarse. The machine's speed drifts between rungs,
// so run the benchmark several times rather than with -count, which runs
// each rung its count of times in a row:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench ScriptCost -benchtime 20000x .; done
func BenchmarkScriptCost(b *testing.B) {
	rdb, cnt := benchRedis(b)
	m := must(benchClient(b, rdb).NewMutex(benchKey(b)))
	requests := benchRecordLockUnlock(b, rdb, m)
	for _, tc := range []struct {
		name string
		op   func(testing.TB)
	}{
		{"return", benchReplay(rdb, testScript("return 1"), requests)},
		{"state read", benchReplay(rdb, testScript(benchStateRead), requests)},
		{"lib.lua", benchReplay(rdb, testScript(luaLib+"\nreturn 1"), requests)},
		{"Lock+Unlock", benchLockUnlock(m)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			tc.op(b) // loads the script
			before := benchServer(b, ctx, rdb)
			sent0 := cnt.n.Load()
			n := 0
			for b.Loop() {
				tc.op(b)
				n++
			}
			sent := cnt.n.Load() - sent0
			after := benchServer(b, ctx, rdb)
			var exec, cmd float64
			for name, usec := range after.usec {
				switch d := usec - before.usec[name]; name {
				case "fcall", "evalsha", "eval":
					exec += d
				case "info":
				default:
					cmd += d
				}
			}
			per := func(v float64) float64 { return v / float64(n) }
			b.ReportMetric(per(float64(sent)), "cmds/op")
			b.ReportMetric(per(exec), "exec-µs/op")
			b.ReportMetric(per(cmd), "cmd-µs/op")
			b.ReportMetric(per(after.cpu-before.cpu), "cpu-µs/op")
			b.ReportMetric(per(after.sys-before.sys), "sys-µs/op")
		})
	}
}

// benchStateRead reads a lock's state as an acquire does (lock_lib.lua,
// load_lock; KEYS[1] the lock's hash), and the clock, and returns.
const benchStateRead = `
redis.call('HMGET', KEYS[1], '{layout}', '{owner}', '{end}', '{token}', '{queue}', '{seq}',
  '{popped}', '{wake}', '{refuse}', '{expires}', '{meta}', '{freed}')
redis.call('TIME')
return 1`

// benchLockUnlock returns an uncontended Lock then Unlock of m.
func benchLockUnlock(m *Mutex) func(testing.TB) {
	return func(tb testing.TB) {
		ctx := context.Background()
		if err := m.Lock(ctx); err != nil {
			tb.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			tb.Fatal(err)
		}
	}
}

// benchRecordLockUnlock returns the two script calls an uncontended Lock
// then Unlock of m sends, once the scripts are loaded.
func benchRecordLockUnlock(b *testing.B, rdb *redis.Client, m *Mutex) []benchScriptCall {
	b.Helper()
	lockUnlock := benchLockUnlock(m)
	lockUnlock(b) // loads the scripts and opens the connection
	rec := &benchRecorder{}
	addHook(rdb, rec)
	rec.arm()
	lockUnlock(b)
	requests := rec.disarm()
	if len(requests) != 2 {
		b.Fatalf("Lock+Unlock sent %d script calls; want 2", len(requests))
	}
	return requests
}

// benchReplay returns a function that sends requests, each as a call of
// script s, from its caller's goroutine.
func benchReplay(rdb *redis.Client, s *luaScript, requests []benchScriptCall) func(testing.TB) {
	return func(tb testing.TB) {
		for _, r := range requests {
			if err := s.Run(context.Background(), rdb, r.keys, r.args...).Err(); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// benchScriptCall is the keys and arguments of one script call.
type benchScriptCall struct {
	keys []string
	args []any
}

// benchRecorder is a go-redis hook that records the script calls sent
// while it is armed.
type benchRecorder struct {
	passHooks
	mu     sync.Mutex
	armed  bool
	script []benchScriptCall
}

// arm starts recording, forgetting what was recorded before.
func (r *benchRecorder) arm() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed, r.script = true, nil
}

// disarm stops recording and returns what was recorded.
func (r *benchRecorder) disarm() []benchScriptCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = false
	return r.script
}

func (r *benchRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(cmd)
		return next(ctx, cmd)
	}
}

// record keeps cmd's keys and arguments when it is a script call
// (EVALSHA sha or FCALL function, then numkeys key... arg...) made while r
// is armed; a retry as EVAL (NOSCRIPT) is not recorded again.
func (r *benchRecorder) record(cmd redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if name := cmd.Name(); !r.armed || (name != "evalsha" && name != "fcall") {
		return
	}
	a := cmd.Args()
	numKeys := a[2].(int)
	call := benchScriptCall{args: a[3+numKeys:]}
	for _, k := range a[3 : 3+numKeys] {
		call.keys = append(call.keys, k.(string))
	}
	r.script = append(r.script, call)
}

// BenchmarkScriptLoop prices the lock scripts' own work, without a round
// trip or the cost of calling a script: one script call runs an
// uncontended acquire then release (the bodies of acquire.lua and
// release.lua, with the helpers they run on) benchScriptLoopPairs times.
// It reports us/pair, the time of one acquire+release inside Redis. The
// figure is what a change of the scripts' Lua, or of the calls they make,
// saves; it is smaller than the same work called by clients, when the
// server's caches are cold between requests (BenchmarkScriptCost).
func BenchmarkScriptLoop(b *testing.B) {
	rdb, _ := benchRedis(b)
	s := testScript(luaLib + luaLockLib +
		"\nlocal function run_acquire(KEYS, ARGV)\n" + luaAcquire + "\nend\n" +
		"\nlocal function run_release(KEYS, ARGV)\n" + luaRelease + "\nend\n" +
		benchScriptLoop)
	k := schema.LockKeys(schema.DefaultPrefix, benchKey(b))
	keys := []string{k.Hash, k.Queue, k.Bargers}
	ctx := context.Background()
	for b.Loop() {
		if err := s.Run(ctx, rdb, keys, benchScriptLoopPairs).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*benchScriptLoopPairs), "us/pair")
}

// benchScriptLoopPairs is how many acquire+release pairs one call of
// benchScriptLoop runs.
const benchScriptLoopPairs = 1000

// benchScriptLoop runs ARGV[1] uncontended acquire+release pairs on the
// lock of KEYS, failing if one does not take or release the lock.
const benchScriptLoop = `
local ticket = 'bench/0123456789abcdef-1.0123456789abcdef01234567'
for _ = 1, tonumber(ARGV[1]) do
  begin_call()
  local r = run_acquire(KEYS, {ticket, '30000', 'queue', '15000', '30000', '', '0'})
  if r[1] ~= 1 then
    error('acquire: ' .. tostring(r[1]))
  end
  begin_call()
  if run_release(KEYS, {ticket, string.format('%d', r[2]), 'release'}) ~= 1 then
    error('release')
  end
end
return 1`
