package fault

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Helpers that read a lock's state, layout 3 (internal/schema): one hash
// that a release does not delete, so that "held" is its owner with a lease
// that has not ended by the server's clock, not "the key exists", and the
// lease left is its end less the server's time, not the key's PTTL.

// lockStateOn returns what the lock hash key says on rdb, and the
// server's time in ms, read in one round trip; it fails the test when the
// hash is not a lock's of this layout.
func lockStateOn(t testing.TB, rdb redis.Cmdable, key string) (schema.LockState, int64) {
	t.Helper()
	var all *redis.MapStringStringCmd
	var now *redis.TimeCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, key)
		now = p.Time(ctx)
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	st, ok := schema.ParseLockState(all.Val())
	if !ok {
		t.Fatalf("%s is not a lock of layout %d: %q", key, schema.Layout, all.Val())
	}
	return st, now.Val().UnixMilli()
}

// heldOn reports whether the lock hash key names a holder whose lease has
// not ended by rdb's clock.
func heldOn(t testing.TB, rdb redis.Cmdable, key string) bool {
	t.Helper()
	st, now := lockStateOn(t, rdb, key)
	return st.Held(now)
}

// leaseOn returns the lease left of the hold of the lock hash key by
// rdb's clock, 0 when it is not held.
func leaseOn(t testing.TB, rdb redis.Cmdable, key string) time.Duration {
	t.Helper()
	st, now := lockStateOn(t, rdb, key)
	if !st.Held(now) {
		return 0
	}
	return time.Duration(st.End-now) * time.Millisecond
}

// lockQueueKey returns the fair queue (a list of schema.QueueRecord) of
// the lock hash key.
func lockQueueKey(key string) string { return key + ":waiting" }

// queueRecordsOn returns the records in the fair queue of the lock hash
// key, oldest first, failing the test on one that does not parse.
func queueRecordsOn(t testing.TB, rdb redis.Cmdable, key string) []schema.QueueRecord {
	t.Helper()
	recs, err := rdb.LRange(ctx, lockQueueKey(key), 0, -1).Result()
	if err != nil {
		t.Fatalf("reading the queue of %s: %v", key, err)
	}
	out := make([]schema.QueueRecord, 0, len(recs))
	for _, r := range recs {
		q, ok := schema.ParseQueueRecord(r)
		if !ok {
			t.Fatalf("the queue of %s holds a record that does not parse: %q", key, r)
		}
		out = append(out, q)
	}
	return out
}

// lockLeft describes what the lock hash key has left in Redis of holds
// and waiters: a hold whose lease has not ended, queued records (counted
// in the hash, or in the queue's list) and Clients' liveness deadlines;
// "" when nothing. A free lock's hash itself stays (layout 3), and so do
// the tombstones of withdrawn calls, which expire.
func lockLeft(t testing.TB, rdb redis.Cmdable, key string) string {
	t.Helper()
	st, now := lockStateOn(t, rdb, key)
	var left []string
	if st.Held(now) {
		left = append(left, fmt.Sprintf("held by %s for %dms more", st.Owner, st.End-now))
	}
	if st.Queue != 0 {
		left = append(left, fmt.Sprintf("%d queued by the hash", st.Queue))
	}
	if recs, err := rdb.LRange(ctx, lockQueueKey(key), 0, -1).Result(); err != nil || len(recs) > 0 {
		left = append(left, fmt.Sprintf("queue %q (%v)", recs, err))
	}
	if len(st.Clients) > 0 {
		left = append(left, fmt.Sprintf("Clients' deadlines %v", st.Clients))
	}
	return strings.Join(left, ", ")
}

// ticketQueued reports whether the fair queue of the lock hash key holds
// a record of ticket.
func ticketQueued(t testing.TB, rdb redis.Cmdable, key, ticket string) bool {
	t.Helper()
	for _, r := range queueRecordsOn(t, rdb, key) {
		if r.Ticket == ticket {
			return true
		}
	}
	return false
}

// holdLeft describes the hold key keeps: the lease left of a lock's
// hold, the PTTL of another key.
func holdLeft(t *testing.T, rdb *redis.Client, key string) string {
	t.Helper()
	if strings.HasPrefix(key, "redisync:lock:") {
		return fmt.Sprintf("lease %v", leaseOn(t, rdb, key))
	}
	return fmt.Sprintf("holders %v", semHolders(t, rdb, key))
}

// semHolders returns the holder records of the semaphore (or read-write
// lock) whose hash is key (schema.SemHolderField).
func semHolders(t *testing.T, rdb *redis.Client, key string) map[string]string {
	t.Helper()
	h, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	maps.DeleteFunc(h, func(f, _ string) bool { return !schema.SemHolderField(f) })
	return h
}
