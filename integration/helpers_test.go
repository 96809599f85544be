package integration

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

var ctx = context.Background()

// uniqueName returns a lock name that no other test uses.
func uniqueName(t *testing.T) string {
	return strings.ReplaceAll(t.Name(), "/", "-") + "-" + uuid.NewString()[:8]
}

// newClients returns n redisync Clients, each on a go-redis client of its
// own (as n processes would have), closed at the end of the test.
func newClients(t *testing.T, n int, opts ...redisync.Option) []*redisync.Client {
	t.Helper()
	addr := redistest.Addr(t)
	cs := make([]*redisync.Client, n)
	for i := range cs {
		cs[i] = redisync.New(redistest.NewClient(t, addr), opts...)
		c := cs[i]
		t.Cleanup(func() { _ = c.Close() })
	}
	return cs
}

// admin returns a plain go-redis client for looking at and changing keys.
func admin(t *testing.T) *redis.Client {
	t.Helper()
	return redistest.Client(t)
}

// eventually fails the test unless cond becomes true within d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// cmdCounter counts the commands one Redis server executes, from INFO
// commandstats (scripts' inner calls included).
type cmdCounter struct{ rdb *redis.Client }

// stats returns the calls of each command so far, by lower-case name.
func (c cmdCounter) stats(t *testing.T) map[string]int64 {
	t.Helper()
	info, err := c.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	stats := make(map[string]int64)
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, rest, _ := strings.Cut(rest, ":calls=")
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		stats[name] = n
	}
	return stats
}

// total returns the number of calls of every command so far.
func (c cmdCounter) total(t *testing.T) int64 {
	t.Helper()
	var n int64
	for _, calls := range c.stats(t) {
		n += calls
	}
	return n
}

// callsOf returns how many times Redis ran the command cmd ("evalsha"
// counts script calls, not their inner calls).
func callsOf(t *testing.T, c cmdCounter, cmd string) int64 {
	t.Helper()
	return c.stats(t)[cmd]
}

// inCS counts goroutines inside a critical section and records the most
// seen at once.
type inCS struct{ now, max atomic.Int64 }

func (c *inCS) enter() {
	n := c.now.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (c *inCS) leave() { c.now.Add(-1) }
