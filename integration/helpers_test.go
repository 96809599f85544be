package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
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

// statsDiff returns the calls of each command between two stats.
func statsDiff(before, after map[string]int64) map[string]int64 {
	d := make(map[string]int64)
	for name, n := range after {
		if n != before[name] {
			d[name] = n - before[name]
		}
	}
	return d
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
		ls[i] = must(cs[i%len(cs)].NewMutex(name, opts...))
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

// lockStateOn returns what the lock's hash key says on the server of rdb,
// and that server's time in ms, failing the test when the hash is not a
// lock's of this layout.
func lockStateOn(t *testing.T, rdb redis.Cmdable, key string) (schema.LockState, int64) {
	t.Helper()
	h, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	st, ok := schema.ParseLockState(h)
	if !ok {
		t.Fatalf("%s is not a lock of layout %d: %q", key, schema.Layout, h)
	}
	return st, serverNow(t, rdb)
}

// serverNow returns the clock of the server of rdb, in ms.
func serverNow(t *testing.T, rdb redis.Cmdable) int64 {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// heldOn reports whether the lock whose hash is key is held on the server
// of rdb: it names an owner whose lease has not ended by the server's
// clock.
func heldOn(t *testing.T, rdb redis.Cmdable, key string) bool {
	t.Helper()
	st, now := lockStateOn(t, rdb, key)
	return st.Held(now)
}

// heldCount returns on how many of the servers of rdbs the lock whose
// hash is key is held.
func heldCount(t *testing.T, key string, rdbs ...*redis.Client) int {
	t.Helper()
	n := 0
	for _, rdb := range rdbs {
		if heldOn(t, rdb, key) {
			n++
		}
	}
	return n
}

// leaseOn returns the lease left to the holder of the lock whose hash is
// key, by the clock of the server of rdb; 0 when it is not held.
func leaseOn(t *testing.T, rdb redis.Cmdable, key string) time.Duration {
	t.Helper()
	st, now := lockStateOn(t, rdb, key)
	if !st.Held(now) {
		return 0
	}
	return time.Duration(st.End-now) * time.Millisecond
}

// waitingLen returns how many records the fair queue of the lock whose
// hash is key holds.
func waitingLen(t *testing.T, rdb redis.Cmdable, key string) int64 {
	t.Helper()
	n, err := rdb.LLen(ctx, key+":waiting").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// lockLeftovers returns the keys of the lock whose hash is key that hold
// something, described: every key of its hash tag but the lock's hash when
// it is not held (a release leaves it, owner ”) and tombstones
// ("withdrawn", TTL at most an hour) that calls which withdrew with a
// send in flight leave by design.
func lockLeftovers(t *testing.T, rdb redis.Cmdable, key string) []string {
	t.Helper()
	var out []string
	if st, now := lockStateOn(t, rdb, key); st.Held(now) {
		out = append(out, fmt.Sprintf("%s held by %q for %d ms more", key, st.Owner, st.End-now))
	}
	return append(out, otherLockKeys(t, rdb, key)...)
}

// otherLockKeys returns the keys of the lock whose hash is key, but its
// hash, that hold something, described (see lockLeftovers).
func otherLockKeys(t *testing.T, rdb redis.Cmdable, key string) []string {
	t.Helper()
	tag := key[strings.IndexByte(key, '{'):]
	keys, err := rdb.Keys(ctx, "*"+tag+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range keys {
		if k == key {
			continue
		}
		if strings.HasPrefix(k, key+":released:") {
			v, _ := rdb.Get(ctx, k).Result()
			ttl := rdb.PTTL(ctx, k).Val()
			if v == "withdrawn" && ttl > 0 && ttl <= time.Hour {
				continue
			}
			out = append(out, fmt.Sprintf("%s = %q (PTTL %v)", k, v, ttl))
			continue
		}
		out = append(out, fmt.Sprintf("%s (%s, PTTL %v)", k, rdb.Type(ctx, k).Val(), rdb.PTTL(ctx, k).Val()))
	}
	return out
}

// must returns v, a value that a constructor made, and panics with err,
// the constructor's error: a test whose arguments are valid by design
// fails at once (and loudly) if they are not.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// observeChan ranges over e.Observe(ctx) in a goroutine and sends the
// states to the returned channel, which is closed when the sequence ends.
func observeChan(ctx context.Context, e *redisync.Election) <-chan redisync.Leadership {
	out := make(chan redisync.Leadership)
	go func() {
		defer close(out)
		for l, err := range e.Observe(ctx) {
			if err != nil {
				return
			}
			select {
			case out <- l:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}
