package integration

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

var ctx = context.Background()

// newClients returns n redisync Clients, each on a go-redis client of its
// own (as n processes would have), closed at the end of the test.
func newClients(t *testing.T, n int, opts ...redisync.Option) []*redisync.Client {
	t.Helper()
	addr := redistest.Addr(t)
	cs := make([]*redisync.Client, n)
	for i := range cs {
		nc, err := redisync.New(redistest.NewClient(t, addr), opts...)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = nc
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
var eventually = redistest.Eventually

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

// locker is a lock as contend takes it: a *redisync.Mutex or a
// *redisync.RedMutex.
type locker interface {
	Lock(context.Context) error
	Unlock(context.Context) error
	Token() int64
}

// contention is what contend saw.
type contention struct {
	counts []int   // acquisitions of each locker
	tokens []int64 // the token of every hold, in the order of the holds
}

// contend has one goroutine per locker take it, hold it for hold (the
// work done under the lock) and let it go, again and again while more(n)
// says so, n being that goroutine's acquisitions so far. It fails the test
// on an error, or if two goroutines were ever inside at once.
func contend(t *testing.T, ls []locker, hold time.Duration, more func(n int) bool) contention {
	t.Helper()
	var in inCS
	var mu sync.Mutex
	res := contention{counts: make([]int, len(ls))}
	var wg sync.WaitGroup
	errs := make(chan error, len(ls))
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; more(n); n++ {
				if err := l.Lock(ctx); err != nil {
					errs <- err
					return
				}
				in.enter()
				mu.Lock()
				res.tokens = append(res.tokens, l.Token())
				res.counts[i]++
				mu.Unlock()
				time.Sleep(hold)
				in.leave()
				if err := l.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := in.max.Load(); n != 1 {
		t.Fatalf("%d holders were inside the critical section at once", n)
	}
	return res
}

// rounds is a more function for contend: n acquisitions each.
func rounds(n int) func(int) bool { return func(k int) bool { return k < n } }

// until is a more function for contend: acquisitions until deadline.
func until(deadline time.Time) func(int) bool {
	return func(int) bool { return time.Now().Before(deadline) }
}

// mutexes returns n Mutex values for name, dealt round-robin to cs.
func mutexes(cs []*redisync.Client, name string, n int, opts ...redisync.Option) []locker {
	ls := make([]locker, n)
	for i := range ls {
		ls[i] = cs[i%len(cs)].NewMutex(name, opts...)
	}
	return ls
}

// increasing fails the test unless tokens strictly increase.
func increasing(t *testing.T, tokens []int64) {
	t.Helper()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after %d: tokens must strictly increase", tokens[i], tokens[i-1])
		}
	}
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
