package fault

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// Helpers of the regression tests named TestFinding*: each of those
// guards one finding of the review of the library's core, and fails on
// the code the finding was made on.

// queueKey and tokenKey are a lock's fair queue and fencing token counter
// under the default prefix.
func queueKey(name string) string { return lockKey(name) + ":queue" }
func tokenKey(name string) string { return lockKey(name) + ":token" }

// queued returns how many fair waiters are queued on a lock.
func queued(t *testing.T, rdb *redis.Client, name string) int64 {
	t.Helper()
	n, err := rdb.ZCard(ctx, queueKey(name)).Result()
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

// settle waits until px has read nothing from its clients for quiet: a
// waiter behind it has made its attempts and sleeps (it sends nothing but
// heartbeats, which the callers space further apart than quiet).
func settle(t *testing.T, px *redistest.Proxy, quiet, d time.Duration) {
	t.Helper()
	eventually(t, d, "the clients behind the proxy to fall quiet", func() bool {
		return time.Since(px.LastRead(true)) > quiet
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
