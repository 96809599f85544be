package redisync

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/layout2"
	"github.com/redisync/redisync/internal/redistest"
)

// The upgrade from layout 2 to layout 3, on a real Redis: a layout-2
// process (internal/layout2, the frozen layout-2 fair Mutex) and a
// layout-3 one (this package) on the same lock names, as during a rolling
// upgrade. Each refuses the other's state with a LAYOUT error and takes
// nothing; once the layout-2 state is gone, layout 3 takes the name over
// with a fencing token larger than layout 2's last; and the two never hold
// a name at once.

// upgradeSetup returns a prefix of the test's own, a client to the
// package's Redis, a layout-2 Client and a layout-3 Client on it, closed
// when the test ends.
func upgradeSetup(t *testing.T) (prefix string, rdb *redis.Client, c2 *layout2.Client, c3 *Client) {
	t.Helper()
	prefix = "upg-" + strings.NewReplacer("{", "_", "}", "_").Replace(redistest.Name(t))
	rdb = redistest.Client(t)
	c2 = layout2.NewClient(redistest.Client(t), prefix)
	t.Cleanup(func() { _ = c2.Close() })
	c3, err := New(redistest.Client(t), WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c3.Close() })
	return prefix, rdb, c2, c3
}

// upgradeKeys returns every key under prefix with its type, value and TTL
// (rounded to the minute), for comparing the state before and after calls
// that must take nothing; tombstones (":released:<ticket>", which a call
// that failed may leave for its late copies) are returned apart, with
// their TTLs.
func upgradeKeys(t *testing.T, rdb *redis.Client, prefix string) (state map[string]string, tombstones map[string]time.Duration) {
	t.Helper()
	ctx := context.Background()
	state, tombstones = map[string]string{}, map[string]time.Duration{}
	keys, err := rdb.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		ttl := rdb.PTTL(ctx, k).Val()
		if strings.Contains(k, ":released:") {
			tombstones[k] = ttl
			continue
		}
		var v string
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "hash":
			h := rdb.HGetAll(ctx, k).Val()
			fs := slices.Sorted(maps.Keys(h))
			for _, f := range fs {
				v += f + "=" + h[f] + " "
			}
		case "string":
			v = rdb.Get(ctx, k).Val()
		case "list":
			v = strings.Join(rdb.LRange(ctx, k, 0, -1).Val(), "|")
		case "zset":
			for _, z := range rdb.ZRangeWithScores(ctx, k, 0, -1).Val() {
				v += z.Member.(string) + "=" + strconv.FormatFloat(z.Score, 'f', -1, 64) + " "
			}
		default:
			v = typ
		}
		state[k] = v + " ttl~" + ttl.Round(time.Minute).String()
	}
	return state, tombstones
}

// checkTookNothing fails the test when the keys under prefix changed from
// before, but for tombstones, which must run out within the hour.
func checkTookNothing(t *testing.T, rdb *redis.Client, prefix string, before map[string]string) {
	t.Helper()
	after, tombs := upgradeKeys(t, rdb, prefix)
	if !maps.Equal(before, after) {
		t.Errorf("the state changed:\nbefore %q\nafter  %q", before, after)
	}
	for k, ttl := range tombs {
		if ttl <= 0 || ttl > time.Hour {
			t.Errorf("tombstone %s left with TTL %v, want one of at most an hour", k, ttl)
		}
	}
}

// (a) A layout-2 process holds: a layout-3 Lock or TryLock of the name
// fails with ErrLayout, at once, and takes nothing; the layout-2 hold goes
// on and its Unlock succeeds.
func TestUpgradeLayout2HoldRefusesLayout3(t *testing.T) {
	prefix, rdb, c2, c3 := upgradeSetup(t)
	ctx := context.Background()
	name := "job"
	m2 := c2.NewMutex(name)
	if err := m2.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, layout2.LockKey(prefix, name)).Val(); n != 1 {
		t.Fatalf("the layout-2 hold wrote no hash at %s", layout2.LockKey(prefix, name))
	}
	before, _ := upgradeKeys(t, rdb, prefix)
	for _, m3 := range []*Mutex{must(c3.NewMutex(name)), must(c3.NewMutex(name, Barging()))} {
		ok, err := m3.TryLock(ctx)
		if ok || !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "layout 2") {
			t.Errorf("TryLock over a layout-2 hold: %v, %v; want ErrLayout naming layout 2", ok, err)
		}
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second) // fail, not hang, if it waited
		start := time.Now()
		err = m3.Lock(lctx)
		cancel()
		if !errors.Is(err, ErrLayout) || time.Since(start) > time.Second {
			t.Errorf("Lock over a layout-2 hold: %v after %v; want ErrLayout at once", err, time.Since(start))
		}
		if m3.Token() != 0 {
			t.Errorf("a layout-3 Mutex has the token %d after its calls failed", m3.Token())
		}
		if err := m3.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
			t.Errorf("Unlock of the layout-3 Mutex whose calls failed: %v, want ErrNotHeld", err)
		}
	}
	checkTookNothing(t, rdb, prefix, before)
	// Inspecting it either fails (a hash of another layout) or shows the
	// layout-2 holder: never a free lock.
	if st, err := c3.InspectLock(ctx, name); err == nil && st.Holder == nil {
		t.Errorf("InspectLock of a layout-2 hold: %+v; want an error or the layout-2 holder, not a free lock", st)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Errorf("the layout-2 holder's Unlock after the layout-3 calls: %v, want its hold intact", err)
	}
}

// (b) A layout-3 Mutex holds: the layout-2 driver's Lock or TryLock fails
// with a LAYOUT error and takes nothing; the layout-3 hold goes on. Its
// hash stays after the release, so layout 2 is refused on a free name too.
func TestUpgradeLayout3HoldRefusesLayout2(t *testing.T) {
	prefix, rdb, c2, c3 := upgradeSetup(t)
	ctx := context.Background()
	name := "job"
	m3 := must(c3.NewMutex(name))
	if err := m3.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	before, _ := upgradeKeys(t, rdb, prefix)
	layoutCalls := func(what string) {
		t.Helper()
		m2 := c2.NewMutex(name)
		ok, err := m2.TryLock(ctx)
		if ok || err == nil || !strings.Contains(err.Error(), "LAYOUT") || !strings.Contains(err.Error(), "layout 3") {
			t.Errorf("layout-2 TryLock %s: %v, %v; want a LAYOUT error naming layout 3", what, ok, err)
		}
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		start := time.Now()
		err = m2.Lock(lctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "LAYOUT") || time.Since(start) > time.Second {
			t.Errorf("layout-2 Lock %s: %v after %v; want a LAYOUT error at once", what, err, time.Since(start))
		}
		if m2.Token() != 0 {
			t.Errorf("the layout-2 Mutex has the token %d after its calls failed", m2.Token())
		}
	}
	layoutCalls("over a layout-3 hold")
	checkTookNothing(t, rdb, prefix, before)
	if held, err := c3.InspectLock(ctx, name); err != nil || held.Holder == nil || held.Holder.Token != m3.Token() {
		t.Errorf("inspect after the layout-2 calls: %+v, %v; want the layout-3 hold", held, err)
	}
	if err := m3.Unlock(ctx); err != nil {
		t.Fatalf("the layout-3 holder's Unlock after the layout-2 calls: %v", err)
	}
	// Free, but its state is kept: layout 2 must still not take it (it
	// would mint tokens from its own counter, and two layouts would share
	// the name).
	before, _ = upgradeKeys(t, rdb, prefix)
	layoutCalls("of a free layout-3 lock")
	checkTookNothing(t, rdb, prefix, before)
}

// (c) Once the layout-2 holder released, layout 3 takes the name, with a
// fencing token larger than layout 2's last: it reads layout 2's token
// counter when it writes its first state. The layout-2 counter is set
// ahead of the clock first, so that a layout 3 that minted from the clock
// alone (tokens are the server clock in µs, or the last plus one) would
// fail.
func TestUpgradeTokenGoesOnIncreasing(t *testing.T) {
	prefix, rdb, c2, c3 := upgradeSetup(t)
	ctx := context.Background()
	name := "job"
	ahead := time.Now().Add(time.Hour).UnixMicro()
	tokenKey := layout2.LockKey(prefix, name) + ":token"
	if err := rdb.Set(ctx, tokenKey, ahead, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	m2 := c2.NewMutex(name)
	var last int64
	for i := range 3 {
		if err := m2.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if tk := m2.Token(); tk <= last || tk <= ahead {
			t.Fatalf("layout-2 hold %d: token %d, want above %d and %d", i, tk, last, ahead)
		}
		last = m2.Token()
		if err := m2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.Exists(ctx, layout2.LockKey(prefix, name)).Val(); n != 0 {
		t.Fatalf("layout 2 left its hash after its last release: %v", rdb.HGetAll(ctx, layout2.LockKey(prefix, name)).Val())
	}
	m3 := must(c3.NewMutex(name))
	if err := m3.Lock(ctx); err != nil {
		t.Fatalf("layout-3 Lock after the layout-2 release: %v", err)
	}
	if tk := m3.Token(); tk != last+1 {
		t.Errorf("layout-3 token %d after layout 2's last %d: want %d (the next after layout 2's counter)", tk, last, last+1)
	}
	first := m3.Token()
	if err := m3.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := m3.TryLock(ctx); !ok || err != nil || m3.Token() <= first {
		t.Errorf("layout-3 TryLock again: %v, %v, token %d; want a token above %d", ok, err, m3.Token(), first)
	}
	if err := m3.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// upgradeChecker checks that holds of one name never overlap, whichever
// layout took them, and that their fencing tokens increase in the order
// the holds were taken.
type upgradeChecker struct {
	t      *testing.T
	inside atomic.Int32
	mu     sync.Mutex
	last   int64
	holds  [2]atomic.Int64 // by layout - 2
}

// hold runs the critical section of a hold of layout l with token tk.
func (c *upgradeChecker) hold(l int, tk int64) {
	if n := c.inside.Add(1); n != 1 {
		c.t.Errorf("layout %d took a hold (token %d) while %d others held it", l, tk, n-1)
	}
	c.mu.Lock()
	if tk <= c.last {
		c.t.Errorf("layout %d hold's token %d, not above the previous hold's %d", l, tk, c.last)
	}
	c.last = tk
	c.mu.Unlock()
	c.holds[l-2].Add(1)
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
	if n := c.inside.Add(-1); n != 0 {
		c.t.Errorf("layout %d left its hold (token %d) with %d others inside", l, tk, n)
	}
}

// (d) N goroutines on layout 2 and N on layout 3 take one name at a time,
// a new name every 200 ms for about 2 s (each name goes from layout 2 to
// layout 3 once: layout 3's state, once written, refuses layout 2 for an
// hour): no two holds ever overlap, tokens increase, and the only errors
// are layout errors.
func TestUpgradeStressNoOverlap(t *testing.T) {
	if testing.Short() {
		t.Skip("a 2 s stress")
	}
	_, _, c2, c3 := upgradeSetup(t)
	const n, rounds, round = 4, 10, 200 * time.Millisecond
	var layoutErrs [2]atomic.Int64
	var total [2]int64
	for r := range rounds {
		name := "stress-" + strconv.Itoa(r)
		chk := &upgradeChecker{t: t}
		ctx, cancel := context.WithTimeout(context.Background(), round)
		var wg sync.WaitGroup
		ended := func(err error) bool { // the round ended the call
			return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
		}
		for g := range n {
			wg.Add(2)
			go func() { // layout 2
				defer wg.Done()
				m := c2.NewMutex(name)
				for i := 0; ctx.Err() == nil; i++ {
					var err error
					ok := true
					if (g+i)%3 == 0 {
						ok, err = m.TryLock(ctx)
					} else {
						err = m.Lock(ctx)
					}
					switch {
					case err != nil && strings.Contains(err.Error(), "LAYOUT"):
						layoutErrs[0].Add(1)
						time.Sleep(time.Millisecond)
						continue
					case err != nil && ended(err):
						return
					case err != nil:
						t.Errorf("layout-2 goroutine %d: %v", g, err)
						return
					case !ok:
						time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
						continue
					}
					chk.hold(2, m.Token())
					if err := m.Unlock(context.Background()); err != nil {
						t.Errorf("layout-2 Unlock: %v", err)
						return
					}
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) // let the name go free at times
				}
			}()
			go func() { // layout 3
				defer wg.Done()
				if r%2 == 0 {
					time.Sleep(5 * time.Millisecond) // let layout 2 take the name first, in half the rounds
				}
				m := must(c3.NewMutex(name))
				for i := 0; ctx.Err() == nil; i++ {
					var err error
					ok := true
					if (g+i)%3 == 0 {
						ok, err = m.TryLock(ctx)
					} else {
						err = m.Lock(ctx)
					}
					switch {
					case errors.Is(err, ErrLayout):
						layoutErrs[1].Add(1)
						time.Sleep(time.Millisecond)
						continue
					case err != nil && ended(err):
						return
					case err != nil:
						t.Errorf("layout-3 goroutine %d: %v", g, err)
						return
					case !ok:
						time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
						continue
					}
					chk.hold(3, m.Token())
					if err := m.Unlock(context.Background()); err != nil {
						t.Errorf("layout-3 Unlock: %v", err)
						return
					}
				}
			}()
		}
		wg.Wait()
		cancel()
		total[0] += chk.holds[0].Load()
		total[1] += chk.holds[1].Load()
	}
	t.Logf("holds: layout 2 %d, layout 3 %d; layout errors: layout 2 %d, layout 3 %d",
		total[0], total[1], layoutErrs[0].Load(), layoutErrs[1].Load())
	if total[0] == 0 || total[1] == 0 || layoutErrs[0].Load() == 0 || layoutErrs[1].Load() == 0 {
		t.Errorf("the layouts did not meet: holds %v, layout errors %d and %d; want both layouts to hold and to be refused",
			total, layoutErrs[0].Load(), layoutErrs[1].Load())
	}
}
