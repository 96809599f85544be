package fault

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Helpers for reading a lock's layout 3 state (internal/schema): one hash
// at lockKey(name) that a release does not delete, the fair queue as a list
// at lockKey(name)+":waiting", and tombstones ":released:<ticket>".

// l3bHash returns the lock name's hash, as HGETALL reads it.
func l3bHash(t testing.TB, rdb redis.Cmdable, name string) map[string]string {
	t.Helper()
	h, err := rdb.HGetAll(ctx, lockKey(name)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// l3bState returns the lock name's state, failing the test when its hash
// is not a layout 3 lock's.
func l3bState(t testing.TB, rdb redis.Cmdable, name string) schema.LockState {
	t.Helper()
	h := l3bHash(t, rdb, name)
	s, ok := schema.ParseLockState(h)
	if !ok {
		t.Fatalf("the hash of lock %s is not a layout %d lock's: %v", name, schema.Layout, h)
	}
	return s
}

// l3bHeld reports whether the lock name is held now by the server's clock.
func l3bHeld(t testing.TB, rdb redis.Cmdable, name string) bool {
	t.Helper()
	s := l3bState(t, rdb, name)
	return s.Held(l3bNow(t, rdb))
}

// l3bNow returns the server's clock in ms.
func l3bNow(t testing.TB, rdb redis.Cmdable) int64 {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// l3bLease returns what is left of the lock name's lease by the server's
// clock ({end} minus now), or 0 when it is not held.
func l3bLease(t testing.TB, rdb redis.Cmdable, name string) time.Duration {
	t.Helper()
	s := l3bState(t, rdb, name)
	now := l3bNow(t, rdb)
	if !s.Held(now) {
		return 0
	}
	return time.Duration(s.End-now) * time.Millisecond
}

// l3bToken returns the last fencing token the lock name issued.
func l3bToken(t testing.TB, rdb redis.Cmdable, name string) int64 {
	t.Helper()
	return l3bState(t, rdb, name).Token
}

// l3bTombstones returns the lock name's tombstone keys.
func l3bTombstones(t testing.TB, rdb redis.Cmdable, name string) []string {
	t.Helper()
	var keys []string
	iter := rdb.Scan(ctx, 0, globEscape(lockKey(name)+":released:")+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// l3bLeftovers returns what of the lock name is left that should not be
// once every call on it returned: a hold, a queued record, a tombstone
// other than "withdrawn" with a TTL of at most an hour. The lock's hash
// itself stays by design, free.
func l3bLeftovers(t testing.TB, rdb redis.Cmdable, name string) []string {
	t.Helper()
	var left []string
	h := l3bHash(t, rdb, name)
	s, ok := schema.ParseLockState(h)
	switch {
	case !ok:
		left = append(left, fmt.Sprintf("%s is not a layout %d lock's hash: %v", lockKey(name), schema.Layout, h))
	case s.Held(l3bNow(t, rdb)):
		left = append(left, fmt.Sprintf("%s still held by %q (end %d, pttl of the hold %v)", lockKey(name), s.Owner, s.End, l3bLease(t, rdb, name)))
	case s.Queue != 0:
		left = append(left, fmt.Sprintf("%s still counts %d queued", lockKey(name), s.Queue))
	}
	q := lockKey(name) + ":waiting"
	if n := rdb.LLen(ctx, q).Val(); n != 0 {
		left = append(left, fmt.Sprintf("%s holds %d records: %v", q, n, rdb.LRange(ctx, q, 0, -1).Val()))
	}
	for _, k := range l3bTombstones(t, rdb, name) {
		v, _ := rdb.Get(ctx, k).Result()
		ttl := rdb.PTTL(ctx, k).Val()
		if v != "withdrawn" || ttl < 0 || ttl > time.Hour {
			left = append(left, fmt.Sprintf("tombstone %s = %q, pttl %v", k, v, ttl))
		}
	}
	return left
}

// l3bSettled waits up to d for l3bLeftovers to be empty and returns what
// was left at the end.
func l3bSettled(t testing.TB, rdb redis.Cmdable, name string, d time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := l3bLeftovers(t, rdb, name)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(10 * time.Millisecond) // poll interval of the condition
	}
}

// l3bClientFields returns the {client}<id> fields of a lock's hash h.
func l3bClientFields(h map[string]string) map[string]string {
	out := map[string]string{}
	for f, v := range h {
		if strings.HasPrefix(f, "{client}") {
			out[f] = v
		}
	}
	return out
}

// l3bSnapshot returns the contents of keys (not their TTLs), but for the
// {refuse} field of a lock's hash: that field and "withdrawn" tombstones
// are what a call writes when it withdraws its ticket after a failed
// attempt whose send may have run (see l3bWithdrawals).
func l3bSnapshot(t testing.TB, rdb redis.Cmdable, keys []string) []string {
	t.Helper()
	out := make([]string, len(keys))
	for i, k := range keys {
		typ := rdb.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = rdb.Get(ctx, k).Val()
		case "hash":
			h := rdb.HGetAll(ctx, k).Val()
			delete(h, schema.RefuseField)
			v = h
		case "zset":
			v = rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "list":
			v = rdb.LRange(ctx, k, 0, -1).Val()
		case "set":
			v = rdb.SMembers(ctx, k).Val()
		}
		out[i] = fmt.Sprintf("%s (%s) = %v", k, typ, v)
	}
	return out
}

// l3bBadTombstones returns the lock name's tombstones that are not
// "withdrawn" with a TTL of at most an hour.
func l3bBadTombstones(t testing.TB, rdb redis.Cmdable, name string) []string {
	t.Helper()
	var bad []string
	for _, k := range l3bTombstones(t, rdb, name) {
		v, _ := rdb.Get(ctx, k).Result()
		ttl := rdb.PTTL(ctx, k).Val()
		if v != "withdrawn" || ttl < 0 || ttl > time.Hour {
			bad = append(bad, fmt.Sprintf("%s = %q, pttl %v", k, v, ttl))
		}
	}
	return bad
}
