package redisync

import (
	"strconv"
	"testing"

	"github.com/redisync/redisync/internal/redistest"
)

// BenchmarkMultiMutex measures an uncontended Lock and Unlock of a set of
// 3 free names on a real Redis, side by side: in one script call each
// (the names share a slot, as on one Redis), and one call per name (as
// across the slots of a Cluster). calls/op counts the requests sent.
func BenchmarkMultiMutex(b *testing.B) {
	rdb := redistest.NewClient(b, redistest.Addr(b))
	cnt := &counter{}
	addHook(rdb, cnt)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	base := redistest.Name(b)
	for _, fast := range []bool{true, false} {
		name := "one-call"
		if !fast {
			name = "per-name"
		}
		b.Run(name, func(b *testing.B) {
			var names []string
			for i := range 3 {
				names = append(names, base+":"+name+strconv.Itoa(i))
			}
			m := must(c.NewMultiMutex(names))
			m.fast = fast
			before := cnt.n.Load()
			b.ResetTimer()
			for range b.N {
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cnt.n.Load()-before)/float64(b.N), "calls/op")
		})
	}
}
