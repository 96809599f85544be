package redisync

import (
	"context"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// BenchmarkScriptCost measures where an uncontended Lock+Unlock's Redis
// time goes, on a real Redis (see mutex_bench_test.go), by running beside
// it the same two requests (the same keys and arguments) to scripts that
// do less:
//
//	return       a script that only returns: what any two script calls
//	             with these arguments cost
//	6 reads      a script that makes six reads (GET, HMGET, EXISTS, PTTL,
//	             ZRANGE, TIME: the acquire's first six calls) and returns:
//	             what a redis.call costs, without lib.lua
//	lib.lua      lib.lua's definitions, then return: what every script
//	             pays before its first line (scripts.go prepends lib.lua)
//	Lock+Unlock  the Mutex's acquire and release scripts
//
// Besides ns/op it reports, per operation, from INFO commandstats and cpu:
//
//	exec-µs/op   time Redis spent running the scripts, the commands they
//	             call included (EVALSHA's usec)
//	cmd-µs/op    of which, the commands the scripts call (their own usec)
//	cpu-µs/op    Redis's CPU time (used_cpu_user + used_cpu_sys): exec
//	             plus reading the requests and writing the replies
//	sys-µs/op    of which, the kernel's part (used_cpu_sys)
//
// so that a rung's difference from the one before is what it adds. Run
// it with
//
//	go test -run '^$' -bench ScriptCost -benchtime 20000x -count 5 .
func BenchmarkScriptCost(b *testing.B) {
	rdb, cnt := benchRedis(b)
	m := benchClient(b, rdb).NewMutex(benchKey(b))
	ctx := context.Background()
	lockUnlock := func() {
		if err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	lockUnlock() // loads the scripts and opens the connection
	rec := &benchRecorder{}
	rdb.AddHook(rec)
	rec.arm()
	lockUnlock()
	requests := rec.disarm()
	if len(requests) != 2 {
		b.Fatalf("Lock+Unlock sent %d script calls; want 2", len(requests))
	}
	replay := func(s *redis.Script) func() {
		return func() {
			for _, r := range requests {
				if err := s.Run(ctx, rdb, r.keys, r.args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for _, tc := range []struct {
		name string
		op   func()
	}{
		{"return", replay(redis.NewScript("return 1"))},
		{"6 reads", replay(redis.NewScript(benchSixReads))},
		{"lib.lua", replay(redis.NewScript(luaLib + "\nreturn 1"))},
		{"Lock+Unlock", lockUnlock},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tc.op() // loads the script
			before := benchServer(b, ctx, rdb)
			sent0 := cnt.n.Load()
			n := 0
			for b.Loop() {
				tc.op()
				n++
			}
			sent := cnt.n.Load() - sent0
			after := benchServer(b, ctx, rdb)
			var exec, cmd float64
			for name, usec := range after.usec {
				switch d := usec - before.usec[name]; name {
				case "evalsha", "eval":
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

// benchSixReads makes the six reads an acquire makes first, on the keys of
// a Lock's or Unlock's script call (lock, token counter, queue, waiters,
// tombstone; ARGV[1] the ticket or hold id), and returns.
const benchSixReads = `
redis.call('GET', KEYS[2])
redis.call('HMGET', KEYS[1], ARGV[1], '{layout}')
redis.call('EXISTS', KEYS[5])
redis.call('PTTL', KEYS[1])
redis.call('ZRANGE', KEYS[3], 0, 0)
redis.call('TIME')
return 1`

// benchScriptCall is the keys and arguments of one script call.
type benchScriptCall struct {
	keys []string
	args []any
}

// benchRecorder is a go-redis hook that records the script calls sent
// while it is armed.
type benchRecorder struct {
	mu     sync.Mutex
	armed  bool
	script []benchScriptCall
}

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

func (r *benchRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *benchRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(cmd)
		return next(ctx, cmd)
	}
}

func (r *benchRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// record keeps cmd's keys and arguments when it is a script call
// (EVALSHA sha numkeys key... arg...) made while r is armed; a retry as
// EVAL (NOSCRIPT) is not recorded again.
func (r *benchRecorder) record(cmd redis.Cmder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.armed || cmd.Name() != "evalsha" {
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
