package fault

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/schema"
)

// Helpers that read a lock's fair queue and watch holds, for the scenario
// tests.

// queueKey is a lock's fair queue under the default prefix (layout 3: a
// list of records); tokenKey is the key that holds its fencing token
// counter, which in layout 3 is the lock's hash (field schema.TokenField).
func queueKey(name string) string { return lockKey(name) + ":waiting" }
func tokenKey(name string) string { return lockKey(name) }

// queued returns how many fair waiters are queued on a lock.
func queued(t *testing.T, rdb *redis.Client, name string) int64 {
	t.Helper()
	n, err := rdb.LLen(ctx, queueKey(name)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// closedAt returns a channel that delivers the time ch is closed.
func closedAt(ch <-chan struct{}) <-chan time.Time {
	at := make(chan time.Time, 1)
	go func() { <-ch; at <- time.Now() }()
	return at
}

// grab makes m take the lock with TryLock, asking again as fast as Redis
// answers, and returns the moment it holds it; lost, a holder's Lost
// channel, is looked at as soon as TryLock reports success, and the result
// tells whether it was closed by then. It fails the test after d.
func grab(t *testing.T, m *redisync.Mutex, lost <-chan struct{}, d time.Duration) (at time.Time, lostFirst bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ok, err := m.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return time.Now(), isClosed(lost)
		}
	}
	t.Fatalf("the lock was not free within %v", d)
	return time.Time{}, false
}

// settle waits until the fair waiters of the lock name have made their
// attempts and sleep: no Client's first heartbeats still report a lapse,
// and the lock's queue of records and its hash but for the deadlines that
// heartbeats move stay as they are for quiet.
func settle(t *testing.T, rdb *redis.Client, name string, quiet, d time.Duration) {
	t.Helper()
	var last map[string]string
	changed := time.Now()
	eventually(t, d, "the waiters to make their attempts", func() bool {
		all, err := rdb.HGetAll(ctx, lockKey(name)).Result()
		if err != nil {
			t.Fatal(err)
		}
		records, lapsed := map[string]string{}, false
		for field, v := range all {
			switch {
			case strings.HasPrefix(field, "{client}"):
				// A Client's deadline moves with every heartbeat; its
				// lapse mark (":L", while the first heartbeats report a
				// lapse) has its waiters look again, with an attempt
				// that writes nothing: settled once the mark is gone
				// and the attempt after it had the time to return.
				lapsed = lapsed || strings.HasSuffix(v, ":L")
				records[field] = strconv.FormatBool(strings.HasSuffix(v, ":L"))
			case field != schema.ExpiresField:
				records[field] = v
			}
		}
		recs, err := rdb.LRange(ctx, queueKey(name), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		records[" queue"] = strings.Join(recs, "\n")
		if !maps.Equal(records, last) {
			last, changed = records, time.Now()
		}
		return !lapsed && time.Since(changed) > quiet
	})
}

// cmdCalls returns the calls of each command Redis has run since its
// start (INFO commandstats), by lower-case command name.
func cmdCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		name, rest, ok := strings.Cut(strings.TrimPrefix(l, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(l, "cmdstat_") {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", l, err)
		}
		calls[name] = v
	}
	return calls
}

// othersCommands returns how many commands Redis has run, not counting
// INFO (the probe's own) nor CONFIG and CLIENT.
func othersCommands(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	var n int64
	for name, c := range cmdCalls(t, rdb) {
		if name != "info" && !strings.HasPrefix(name, "config") && !strings.HasPrefix(name, "client") {
			n += c
		}
	}
	return n
}

// unlockQuietly releases a hold whose connection may be cut, bounded by a
// short context; it reports nothing (the tests check what matters first).
func unlockQuietly(m *redisync.Mutex) {
	uctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = m.Unlock(uctx)
}
