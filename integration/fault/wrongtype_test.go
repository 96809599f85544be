package fault

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// A counter holding "1.5" (the token counter, or a lease's
// end) is a value of the wrong type: calls fail with ErrWrongType and
// change nothing, rather than writing and then failing.
func TestFractionalCounterIsWrongType(t *testing.T) {
	for _, tc := range []struct {
		name string
		fair bool
		// setup prepares the keys (m is the Mutex under test) and returns
		// the call that must fail with ErrWrongType.
		setup func(t *testing.T, rdb *redis.Client, base string, m *redisync.Mutex) func() error
	}{
		// Layout 2's token counter, which the first call of layout 3 reads.
		{"lock-free-token", false, func(t *testing.T, rdb *redis.Client, base string, m *redisync.Mutex) func() error {
			rdb.Set(ctx, base+":token", "1.5", 0)
			return func() error { return m.Lock(ctx) }
		}},
		{"lock-free-token-field", false, func(t *testing.T, rdb *redis.Client, base string, m *redisync.Mutex) func() error {
			rdb.HSet(ctx, base, schema.LayoutField, schema.Layout, schema.OwnerField, "", schema.TokenField, "1.5")
			return func() error { return m.Lock(ctx) }
		}},
		{"fair-lock-hands-off-to-queued", true, func(t *testing.T, rdb *redis.Client, base string, m *redisync.Mutex) func() error {
			queueGhost(t, rdb, base)
			rdb.HSet(ctx, base, schema.TokenField, "1.5")
			return func() error { return m.Lock(ctx) }
		}},
		{"unlock-hands-off-to-queued", true, func(t *testing.T, rdb *redis.Client, base string, m *redisync.Mutex) func() error {
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			queueGhost(t, rdb, base)
			rdb.HSet(ctx, base, schema.TokenField, "1.5")
			return func() error { return m.Unlock(ctx) }
		}},
		{"unlock-lease-end", false, func(t *testing.T, rdb *redis.Client, base string, m *redisync.Mutex) func() error {
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			rdb.HSet(ctx, base, schema.EndField, "1.5")
			return func() error { return m.Unlock(ctx) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			rdb := redistest.NewClient(t, addr)
			name := redistest.Name(t)
			base := lockKey(name)
			t.Cleanup(func() {
				keys, _ := rdb.Keys(ctx, globEscape(base)+"*").Result()
				if len(keys) > 0 {
					rdb.Del(ctx, keys...)
				}
			})
			var o []redisync.Option
			if !tc.fair {
				o = append(o, redisync.Barging())
			}
			m := must(newClient(t, addr).NewMutex(name, o...))
			call := tc.setup(t, rdb, base, m)
			before := keysDump(t, rdb, base)
			err := within(t, 5*time.Second, "the call", call)
			after := keysDump(t, rdb, base)
			if !errors.Is(err, redisync.ErrWrongType) {
				t.Errorf("the call returned %v, want ErrWrongType", err)
			}
			if !equalStrings(before, after) {
				t.Errorf("the call changed the lock's keys:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

// queueGhost queues a live-looking fair waiter "ghost" (its deadline an
// hour away) on the lock whose hash is base.
func queueGhost(t *testing.T, rdb *redis.Client, base string) {
	t.Helper()
	now := serverMs(t, rdb)
	if err := rdb.HSetNX(ctx, base, schema.LayoutField, schema.Layout).Err(); err != nil {
		t.Fatal(err)
	}
	seq, err := rdb.HIncrBy(ctx, base, schema.SeqField, 1).Result()
	if err != nil {
		t.Fatal(err)
	}
	rec := schema.QueueRecord{Seq: seq, Ticket: "ghost/ghost-1", Joined: now, Deadline: now + time.Hour.Milliseconds(), Handoff: 3000}
	if err := rdb.RPush(ctx, lockQueueKey(base), rec.String()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HIncrBy(ctx, base, schema.QueueField, 1).Err(); err != nil {
		t.Fatal(err)
	}
}
