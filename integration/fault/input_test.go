package fault

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// ops runs Lock, TryLock and Unlock on m with lctx, each bounded by 5 s
// (a hang fails the test), and returns their errors.
func ops(t *testing.T, m *redisync.Mutex, lctx context.Context) map[string]error {
	t.Helper()
	out := map[string]error{}
	for _, op := range []string{"Lock", "TryLock", "Unlock"} {
		done := make(chan error, 1)
		go func() {
			switch op {
			case "Lock":
				done <- m.Lock(lctx)
			case "TryLock":
				_, err := m.TryLock(lctx)
				done <- err
			default:
				done <- m.Unlock(lctx)
			}
		}()
		select {
		case out[op] = <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s hangs", op)
		}
	}
	return out
}

// TestBadInput gives the constructors and the calls invalid input and
// fails unless each returns an error matching the expected sentinel
// (errors.Is; a bad name or option is refused by NewMutex), promptly,
// without a panic and without a single command or dial reaching Redis
// (counted by a go-redis hook on a live connection to a real server).
func TestBadInput(t *testing.T) {
	huge := strings.Repeat("n", redisync.MaxNameLen+1)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name       string
		lockName   string
		clientOpts []redisync.Option
		mutexOpts  []redisync.Option
		ctx        context.Context
		want       error
		closed     bool
	}{
		{name: "empty name", lockName: "", want: redisync.ErrInvalidName},
		{name: "huge name", lockName: huge, want: redisync.ErrInvalidName},
		{name: "zero lease", mutexOpts: mutexOpts(redisync.WithFixedLease(0)), want: redisync.ErrInvalidOption},
		{name: "negative lease", mutexOpts: mutexOpts(redisync.WithFixedLease(-time.Second)), want: redisync.ErrInvalidOption},
		{name: "sub-ms lease", mutexOpts: mutexOpts(redisync.WithFixedLease(999 * time.Microsecond)), want: redisync.ErrInvalidOption},
		{name: "lease over max", mutexOpts: mutexOpts(redisync.WithFixedLease(redisync.MaxLease + 1)), want: redisync.ErrInvalidOption},
		{name: "overflowing lease", mutexOpts: mutexOpts(redisync.WithFixedLease(math.MaxInt64)), want: redisync.ErrInvalidOption},
		{name: "min int lease", mutexOpts: mutexOpts(redisync.WithFixedLease(math.MinInt64)), want: redisync.ErrInvalidOption},
		{name: "watchdog 2ms", mutexOpts: mutexOpts(redisync.WithCrashTimeout(2 * time.Millisecond)), want: redisync.ErrInvalidOption},
		{name: "negative watchdog", mutexOpts: mutexOpts(redisync.WithCrashTimeout(-1)), want: redisync.ErrInvalidOption},
		{name: "overflowing watchdog", mutexOpts: mutexOpts(redisync.WithCrashTimeout(math.MaxInt64)), want: redisync.ErrInvalidOption},
		{name: "zero heartbeat", mutexOpts: mutexOpts(redisync.WithWaiterTimeout(0)), want: redisync.ErrInvalidOption},
		{name: "zero recheck", mutexOpts: mutexOpts(redisync.WithRecheck(0)), want: redisync.ErrInvalidOption},
		{name: "recheck over max", mutexOpts: mutexOpts(redisync.WithRecheck(redisync.MaxLease + time.Nanosecond)), want: redisync.ErrInvalidOption},
		{name: "empty prefix", mutexOpts: mutexOpts(redisync.WithKeyPrefix("")), want: redisync.ErrInvalidOption},
		{name: "prefix with brace", mutexOpts: mutexOpts(redisync.WithKeyPrefix("a{b")), want: redisync.ErrInvalidOption},
		{name: "invalid client default", clientOpts: opts(redisync.WithFixedLease(-1)), want: redisync.ErrInvalidOption},
		{name: "cancelled ctx", ctx: cancelled, want: context.Canceled},
		{name: "expired ctx", ctx: expired, want: context.DeadlineExceeded},
		{name: "closed client", closed: true, want: redisync.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redistest.NewClient(t, redistest.Addr(t))
			if err := rdb.Ping(ctx).Err(); err != nil { // a live connection, before counting
				t.Fatal(err)
			}
			hook := &countingHook{}
			rdb.AddHook(hook)
			c, err := redisync.New(rdb, append([]redisync.Option{withHook(hook)}, tc.clientOpts...)...)
			if tc.clientOpts != nil {
				// New refuses a bad default itself.
				if c != nil || !errors.Is(err, tc.want) {
					t.Errorf("New: %v, %v; want nil, %v", c, err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.closed {
				_ = c.Close()
			}
			name := tc.lockName
			if name == "" && tc.want != redisync.ErrInvalidName {
				name = redistest.Name(t)
			}
			m, err := c.NewMutex(name, tc.mutexOpts...)
			if m == nil {
				if !errors.Is(err, tc.want) || !errors.Is(err, redisync.ErrInvalid) {
					t.Errorf("NewMutex: %v; want %v", err, tc.want)
				}
				return
			}
			lctx := tc.ctx
			if lctx == nil {
				lctx = ctx
			}
			for op, err := range ops(t, m, lctx) {
				want := tc.want
				if op == "Unlock" && tc.ctx != nil {
					// An ended ctx does not stop an Unlock: it
					// releases what is held, here nothing.
					want = redisync.ErrNotHeld
				}
				if !errors.Is(err, want) {
					t.Errorf("%s: %v, want %v", op, err, want)
				}
			}
			if n, d := hook.cmds.Load(), hook.dials.Load(); n != 0 || d != 0 {
				t.Errorf("%d commands and %d dials reached Redis", n, d)
			}
		})
	}

	t.Run("nil client", func(t *testing.T) {
		if c, err := redisync.New(nil); c != nil || !errors.Is(err, redisync.ErrNilClient) {
			t.Errorf("New(nil): %v, %v; want nil, ErrNilClient", c, err)
		}
	})
	t.Run("unlock not held", func(t *testing.T) {
		rdb := redistest.NewClient(t, redistest.Addr(t))
		hook := &countingHook{}
		rdb.AddHook(hook)
		c, err := redisync.New(rdb, withHook(hook))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := must(c.NewMutex(redistest.Name(t))).Unlock(ctx); !errors.Is(err, redisync.ErrNotHeld) {
			t.Errorf("Unlock: %v, want ErrNotHeld", err)
		}
		if n := hook.cmds.Load(); n != 0 {
			t.Errorf("%d commands reached Redis", n)
		}
	})
}

func opts(o ...redisync.Option) []redisync.Option { return o }

func mutexOpts(o ...redisync.Option) []redisync.Option { return o }

// snapshot returns the type and content of each of a lock's keys
// ("none:" for a missing key).
func snapshot(t *testing.T, rdb *redis.Client, keys []string) []string {
	t.Helper()
	out := make([]string, len(keys))
	for i, k := range keys {
		// The content, not DUMP's bytes: a hash stored as a hash table
		// (a field value over 64 bytes, as a ticket is) may be
		// reordered inside by a read while the server rehashes it.
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v string
		switch typ {
		case "hash":
			h := rdb.HGetAll(ctx, k).Val()
			for _, f := range slices.Sorted(maps.Keys(h)) {
				v += f + "=" + h[f] + "\n"
			}
		case "string":
			v = rdb.Get(ctx, k).Val()
		case "list":
			v = strings.Join(rdb.LRange(ctx, k, 0, -1).Val(), "\n")
		case "set":
			v = strings.Join(slices.Sorted(slices.Values(rdb.SMembers(ctx, k).Val())), "\n")
		case "zset":
			for _, z := range rdb.ZRangeWithScores(ctx, k, 0, -1).Val() {
				v += fmt.Sprint(z.Member, "=", z.Score, "\n")
			}
		}
		out[i] = typ + ":" + v
	}
	return out
}

// TestWrongKeyTypes puts a value of each wrong type at each of a lock's
// keys (layout 3: hash, queue, bargers' zset, and the token counter of
// layout 2 that a new lock's state reads; with the lock held by another
// when the queue or the bargers' zset is planted, so that the waiting call
// meets it) and runs Lock (bounded by
// 3 s) then, if it succeeded, Unlock, on a plain and a fair Mutex. It fails
// if a call panics or hangs, or returns an error that is not ErrWrongType,
// or returns ErrWrongType after changing any of the lock's keys (the
// documented promise: "Nothing is written in that case").
func TestWrongKeyTypes(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	c := newClient(t, addr)
	plant := map[string]func(k string) error{
		"string": func(k string) error { return rdb.Set(ctx, k, "x", 0).Err() },
		"list":   func(k string) error { return rdb.RPush(ctx, k, "x").Err() },
		"set":    func(k string) error { return rdb.SAdd(ctx, k, "x").Err() },
		"zset":   func(k string) error { return rdb.ZAdd(ctx, k, redis.Z{Score: 1, Member: "x"}).Err() },
		"hash":   func(k string) error { return rdb.HSet(ctx, k, "x", "y").Err() },
	}
	// Layout 3: the lock's hash, its fair queue (a list), the zset of
	// Clients with plain waiters, and the token counter of layout 2, which
	// is read only when the lock's state is first created.
	wrong := map[string][]string{ // key suffix -> wrong types
		"":         {"string", "list", "set", "zset"},
		":token":   {"string", "list", "set", "zset", "hash"}, // string "x" is not a counter
		":waiting": {"string", "set", "zset", "hash"},
		":bargers": {"string", "list", "set", "hash"},
	}
	for _, suffix := range []string{"", ":token", ":waiting", ":bargers"} {
		for _, typ := range wrong[suffix] {
			for _, fair := range []bool{false, true} {
				label := "lock" + suffix + "=" + typ
				if fair {
					label += "/fair"
				}
				t.Run(label, func(t *testing.T) {
					name := redistest.Name(t)
					base := lockKey(name)
					keys := []string{base, base + ":token", base + ":waiting", base + ":bargers"}
					t.Cleanup(func() { rdb.Del(ctx, keys...) })
					// The queue is read by a fair waiter that finds the
					// lock taken, the bargers' zset by a plain one: the
					// lock is held by someone else first, so that the
					// call must meet the planted key.
					if (suffix == ":waiting" && fair) || (suffix == ":bargers" && !fair) {
						other := must(newClient(t, addr).NewMutex(name, redisync.WithFixedLease(time.Minute)))
						if err := other.Lock(ctx); err != nil {
							t.Fatal(err)
						}
					}
					if err := plant[typ](base + suffix); err != nil {
						t.Fatal(err)
					}
					var o []redisync.Option
					if !fair {
						o = append(o, redisync.Barging())
					}
					m := must(c.NewMutex(name, o...))
					check := func(op string, call func() error) bool {
						// Layout 3: a call whose attempt failed withdraws its
						// ticket (its send may have run: roundtrip.MayHaveRun),
						// which may write a "withdrawn" tombstone and the
						// hash's {refuse}; nothing else may change.
						before, dumpBefore := l3bSnapshot(t, rdb, keys), keysDump(t, rdb, lockKey(name))
						err := call()
						if err == nil {
							return true
						}
						if !errors.Is(err, redisync.ErrWrongType) {
							t.Fatalf("%s: %v, want nil or ErrWrongType", op, err)
						}
						if bad := l3bBadTombstones(t, rdb, name); len(bad) > 0 {
							t.Fatalf("%s returned ErrWrongType but left tombstones %v", op, bad)
						}
						if after := l3bSnapshot(t, rdb, keys); !equalStrings(before, after) {
							t.Fatalf("%s returned ErrWrongType but changed the lock's keys:\nbefore %v\nafter  %v", op, dumpBefore, keysDump(t, rdb, lockKey(name)))
						}
						return false
					}
					lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					defer cancel()
					if check("Lock", func() error { return m.Lock(lctx) }) {
						check("Unlock", func() error { return m.Unlock(ctx) })
					}
					if lctx.Err() != nil {
						t.Fatal("Lock hung until its deadline")
					}
				})
			}
		}
	}
}

// TestWrongKeyTypesOnRelease is TestWrongKeyTypes for the release that
// hands a fair lock over: the lock is taken cleanly, then a key the
// hand-off meets after the lock's own (layout 3: the queue) is given a
// wrong type, with a waiter queued as the lock's hash counts it. Unlock must return
// ErrWrongType having changed none of the lock's keys, their TTLs
// included: the hand-off reads what it writes before its first write.
func TestWrongKeyTypesOnRelease(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	c := newClient(t, addr)
	// Layout 3: the hand-off meets the fair queue (a list) after the
	// lock's hash, when the hash counts a waiter queued.
	wrong := map[string]func(k string) error{
		":waiting=hash":   func(k string) error { return rdb.HSet(ctx, k, "x", "y").Err() },
		":waiting=string": func(k string) error { return rdb.Set(ctx, k, "x", 0).Err() },
		":waiting=zset":   func(k string) error { return rdb.ZAdd(ctx, k, redis.Z{Score: 1, Member: "ghost"}).Err() },
	}
	for _, label := range []string{":waiting=hash", ":waiting=string", ":waiting=zset"} {
		t.Run("lock"+label, func(t *testing.T) {
			name := redistest.Name(t)
			base := lockKey(name)
			keys := []string{base, base + ":waiting", base + ":bargers"}
			t.Cleanup(func() { rdb.Del(ctx, keys...) })
			m := must(c.NewMutex(name))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			rdb.Del(ctx, base+":waiting")
			if err := wrong[label](base + ":waiting"); err != nil {
				t.Fatal(err)
			}
			rdb.PExpire(ctx, base+":waiting", time.Minute)
			// A waiter queued, as the hash counts it, so that the release
			// hands the lock over and reads the queue.
			if err := rdb.HSet(ctx, base, schema.QueueField, 1).Err(); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, rdb, keys)
			err := m.Unlock(ctx)
			if !errors.Is(err, redisync.ErrWrongType) {
				t.Fatalf("Unlock: %v, want ErrWrongType", err)
			}
			if after := snapshot(t, rdb, keys); !equalStrings(before, after) {
				t.Fatal("Unlock returned ErrWrongType but changed the lock's keys")
			}
			if ttl := rdb.PTTL(ctx, base+":waiting").Val(); ttl <= 0 {
				t.Fatalf("the queue's PTTL after the failed release is %v, was a minute: the release wrote", ttl)
			}
			if !l3bHeld(t, rdb, name) {
				t.Fatal("Unlock returned ErrWrongType but the lock is no longer held")
			}
		})
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// errStub is what the stub hook answers to every command.
var errStub = errors.New("stub: no Redis here")

// stubHook answers every command with errStub, counting them, without
// touching the network: the fuzz targets need no Redis.
type stubHook struct{ countingHook }

func (h *stubHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		cmd.SetErr(errStub)
		return errStub
	}
}

func (h *stubHook) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		for _, c := range cmds {
			c.SetErr(errStub)
		}
		return errStub
	}
}

// fuzzMutex makes a Mutex on a stubbed go-redis client, runs Lock, TryLock
// and Unlock, and checks them against the model: invalid input is refused
// by NewMutex with invalid (the sentinel), with no command sent; valid
// input reaches Redis (errStub comes back) on Lock and TryLock; Unlock of
// nothing held is ErrNotHeld, with no command.
func fuzzMutex(t *testing.T, name string, invalid error, o ...redisync.Option) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	hook := &stubHook{}
	rdb.AddHook(hook)
	c, err := redisync.New(rdb, withHook(hook))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := c.NewMutex(name, o...)
	if invalid != nil {
		if m != nil || !errors.Is(err, invalid) {
			t.Fatalf("NewMutex: %v, %v; want nil, %v", m, err, invalid)
		}
		if n := hook.cmds.Load(); n != 0 {
			t.Fatalf("%d commands sent for invalid input", n)
		}
		return
	}
	if err != nil {
		t.Fatalf("NewMutex: %v", err)
	}
	res := ops(t, m, ctx)
	for _, op := range []string{"Lock", "TryLock"} {
		if !errors.Is(res[op], errStub) {
			t.Fatalf("%s: %v, want the stub's error (a call to Redis)", op, res[op])
		}
	}
	if !errors.Is(res["Unlock"], redisync.ErrNotHeld) {
		t.Fatalf("Unlock: %v, want ErrNotHeld", res["Unlock"])
	}
	if hook.cmds.Load() == 0 {
		t.Fatal("valid input sent no command")
	}
}

// FuzzMutexName checks the name validator: 1 to MaxNameLen bytes of
// anything (braces, NUL, invalid UTF-8) are valid, unless the name starts
// with '}' (its keys would have no hash tag); nothing else is.
func FuzzMutexName(f *testing.F) {
	for _, s := range []string{"", "a", "{x}", "}{", "\x00", "\xff\xfe", "a b\r\nc", strings.Repeat("z", redisync.MaxNameLen), strings.Repeat("z", redisync.MaxNameLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		var invalid error
		if len(name) == 0 || len(name) > redisync.MaxNameLen || name[0] == '}' {
			invalid = redisync.ErrInvalidName
		}
		fuzzMutex(t, name, invalid)
	})
}

// FuzzOptions checks the option validators against their documented
// ranges: lease and recheck in [1ms, MaxLease], watchdog lease and
// heartbeat in [3ms, MaxLease], a prefix non-empty and without braces. A
// zero duration means the option is not given.
func FuzzOptions(f *testing.F) {
	ms := int64(time.Millisecond)
	f.Add(int64(0), int64(0), int64(0), int64(0), "redisync", false)
	f.Add(ms, 3*ms, 3*ms, ms, "p", true)
	f.Add(ms-1, 3*ms-1, 3*ms-1, ms-1, "p", false)
	f.Add(int64(-1), int64(-1), int64(-1), int64(-1), "", true)
	f.Add(int64(redisync.MaxLease), int64(redisync.MaxLease), int64(redisync.MaxLease), int64(redisync.MaxLease), "a:b", true)
	f.Add(int64(redisync.MaxLease)+1, int64(0), int64(0), int64(0), "x", false)
	f.Add(int64(math.MaxInt64), int64(math.MinInt64), int64(0), int64(0), "{", false)
	f.Fuzz(func(t *testing.T, lease, watchdog, heartbeat, recheck int64, prefix string, fair bool) {
		var o []redisync.Option
		bad := false
		inRange := func(v, lo int64) bool { return v >= lo && v <= int64(redisync.MaxLease) }
		if lease != 0 {
			o = append(o, redisync.WithFixedLease(time.Duration(lease)))
			bad = bad || !inRange(lease, ms)
		}
		if watchdog != 0 {
			o = append(o, redisync.WithCrashTimeout(time.Duration(watchdog)))
			bad = bad || !inRange(watchdog, 3*ms)
		}
		if heartbeat != 0 {
			o = append(o, redisync.WithWaiterTimeout(time.Duration(heartbeat)))
			bad = bad || !inRange(heartbeat, 3*ms)
		}
		if recheck != 0 {
			o = append(o, redisync.WithRecheck(time.Duration(recheck)))
			bad = bad || !inRange(recheck, ms)
		}
		o = append(o, redisync.WithKeyPrefix(prefix))
		bad = bad || prefix == "" || strings.ContainsAny(prefix, "{}")
		if !fair {
			o = append(o, redisync.Barging())
		}
		var invalid error
		if bad {
			invalid = redisync.ErrInvalidOption
		}
		fuzzMutex(t, "fuzz", invalid, o...)
	})
}
