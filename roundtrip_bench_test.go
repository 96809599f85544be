//go:build linux || darwin

package redisync

import (
	"context"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// BenchmarkCallHop measures what running a round trip in one of the
// Client's workers (internal/roundtrip) costs the client, on a real Redis
// (see mutex_bench_test.go). It sends the two script calls of an
// uncontended Lock+Unlock, with their keys and arguments, to a script
// that only returns:
//
//	direct       from the caller's goroutine
//	worker       each through the Client's Runner, as the library sends its calls
//	Lock+Unlock  the Mutex itself, for reference (its scripts do more)
//
// Besides ns/op it reports ccpu-µs/op, the test process's CPU time
// (getrusage: user and system, every goroutine) per operation. The
// difference between worker and direct, halved, is the hop's cost per
// call. Run it several times:
//
//	for i in 1 2 3; do go test -run '^$' -bench CallHop -benchtime 10000x .; done
func BenchmarkCallHop(b *testing.B) {
	rdb, _ := benchRedis(b)
	c := benchClient(b, rdb)
	m := c.NewMutex(benchKey(b))
	requests := benchRecordLockUnlock(b, rdb, m)
	noop := redis.NewScript("return 1")
	worker := func(tb testing.TB) {
		for _, r := range requests {
			_, _, err := c.rt.Run(context.Background(), func(ctx context.Context) ([]int64, error) {
				return nil, noop.Run(ctx, rdb, r.keys, r.args...).Err()
			}, nil)
			if err != nil {
				tb.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		op   func(testing.TB)
	}{
		{"direct", benchReplay(rdb, noop, requests)},
		{"worker", worker},
		{"Lock+Unlock", benchLockUnlock(m)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tc.op(b) // loads the script, starts a worker
			before := benchProcessCPU(b)
			n := 0
			for b.Loop() {
				tc.op(b)
				n++
			}
			b.ReportMetric((benchProcessCPU(b)-before)/float64(n), "ccpu-µs/op")
		})
	}
}

// benchProcessCPU returns the CPU time, user and system, that the test
// process has used, in µs.
func benchProcessCPU(b *testing.B) float64 {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}
