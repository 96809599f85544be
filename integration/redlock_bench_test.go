package integration

import (
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// BenchmarkLockUnlock measures an uncontended Lock+Unlock of a single-node
// Mutex against a Redlock over 3 and 5 nodes (local redis-servers), and
// reports the commands each node executes per Lock+Unlock (script calls,
// not counting their inner calls).
func BenchmarkLockUnlock(b *testing.B) {
	b.Run("mutex-1node", func(b *testing.B) {
		s := redistest.Spawn(b)
		c, err := redisync.New(redistest.NewClient(b, s.Addr))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		m := must(c.NewMutex("bench"))
		before := evals(b, s)
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(evals(b, s)-before)/float64(b.N), "scripts/op/node")
	})
	for _, n := range []int{3, 5} {
		b.Run("redlock-"+strconv.Itoa(n)+"nodes", func(b *testing.B) {
			ss := make([]*redistest.Server, n)
			for i := range ss {
				ss[i] = redistest.Spawn(b)
			}
			rl := newBenchRedlock(b, ss)
			defer rl.Close()
			m := must(rl.NewMutex("bench"))
			before := evals(b, ss[0])
			for b.Loop() {
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(evals(b, ss[0])-before)/float64(b.N), "scripts/op/node")
		})
	}
}

func newBenchRedlock(b *testing.B, ss []*redistest.Server) *redisync.Redlock {
	b.Helper()
	rdbs := make([]redis.UniversalClient, len(ss))
	for i, s := range ss {
		rdbs[i] = redistest.NewClient(b, s.Addr)
	}
	r, err := redisync.NewRedlock(rdbs)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// evals counts the EVAL and EVALSHA calls a server has executed.
func evals(b *testing.B, s *redistest.Server) int64 {
	b.Helper()
	info, err := redistest.NewClient(b, s.Addr).Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			_, rest, _ := strings.Cut(line, "calls=")
			calls, _, _ := strings.Cut(rest, ",")
			v, _ := strconv.ParseInt(calls, 10, 64)
			n += v
		}
	}
	return n
}
