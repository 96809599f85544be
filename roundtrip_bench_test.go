//go:build linux || darwin

package redisync

import (
	"context"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
)

// BenchmarkCallHop measures what the way a round trip is run
// (internal/roundtrip) costs the client, on a real Redis (see
// mutex_bench_test.go). It sends the two script calls of an uncontended
// Lock+Unlock, with their keys and arguments, to a script that only
// returns:
//
//	direct       from the caller's goroutine, on the user's client
//	worker       each through a Runner without lanes, in a worker goroutine
//	lane         each through the Client's Runner, on its own connections, as the library sends its calls
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
	m := must(c.NewMutex(benchKey(b)))
	requests := benchRecordLockUnlock(b, rdb, m)
	noop := testScript("return 1")
	workers := roundtrip.New(context.Background(), ErrClosed, nil, rdb, nil)
	defer func() { _ = workers.Close(context.Background()) }()
	runner := func(r *roundtrip.Runner) func(testing.TB) {
		return func(tb testing.TB) {
			for _, q := range requests {
				_, _, err := r.Run(context.Background(), func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
					return nil, noop.Run(ctx, rdb, q.keys, q.args...).Err()
				}, nil)
				if err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
	for _, tc := range []struct {
		name string
		op   func(testing.TB)
	}{
		{"direct", benchReplay(rdb, noop, requests)},
		{"worker", runner(workers)},
		{"lane", runner(c.rt)},
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
