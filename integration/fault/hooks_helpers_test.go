package fault

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// Helpers of the package's scenario tests, which use only the exported
// API, a real redis-server, the documented key layout (to look, or to
// plant a bad value), go-redis hooks and the fault-injecting proxy of
// internal/redistest.

// semKey is a semaphore's hash under the default prefix; its other keys
// add ":expiry", ":queue" and ":ended".
func semKey(name string) string { return "redisync:sem:{" + name + "}" }

// isClosed reports whether ch is closed now (false for nil).
func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// hookFunc is a go-redis hook that sees every single command of the client
// it is added to; it calls next to send the command, or fails it itself.
type hookFunc func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error

func (h hookFunc) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h hookFunc) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return h(ctx, cmd, next) }
}

func (h hookFunc) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// withHook is the option that adds hook to the go-redis client of each of
// a Client's own connections (WithConnSetup). A Client of one server
// (redis.NewClient) sends its script calls (acquire, release, withdraw,
// extend...) and its watchdog's renewals on connections it opens itself,
// which the hooks added to the client given to New do not see; that
// client still carries the subscriber's pub/sub, clean-ups and background
// wake-ups. A test that watches, delays or fails a Client's commands adds
// its hook to both: rdb.AddHook(hook) before New, and withHook(hook) to
// New's options. (A Client of a Redis Cluster or of a failover client has
// no connections of its own: AddHook alone sees everything.)
func withHook(hook redis.Hook) redisync.Option {
	return redisync.WithConnSetup(func(c *redis.Client) error {
		c.AddHook(hook)
		return nil
	})
}

// scriptArgs returns the arguments of a script call (FCALL, EVALSHA or EVAL) as
// strings, or nil for any other command.
func scriptArgs(cmd redis.Cmder) []string {
	if n := strings.ToLower(cmd.Name()); n != "fcall" && n != "evalsha" && n != "eval" {
		return nil
	}
	var out []string
	for _, a := range cmd.Args() {
		out = append(out, fmt.Sprint(a))
	}
	return out
}

// argContains reports whether some argument of args contains sub.
func argContains(args []string, sub string) bool {
	for _, a := range args {
		if strings.Contains(a, sub) {
			return true
		}
	}
	return false
}

// replyError is an error reply from Redis as go-redis types it (a
// redis.Error), for a hook to answer a command with.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// keysDump returns every key whose name starts with prefix, with its type
// and contents (not its TTL), as one sorted, comparable string per key.
func keysDump(t *testing.T, rdb *redis.Client, prefix string) []string {
	t.Helper()
	var keys []string
	iter := rdb.Scan(ctx, 0, globEscape(prefix)+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		typ := rdb.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = rdb.Get(ctx, k).Val()
		case "hash":
			v = rdb.HGetAll(ctx, k).Val()
		case "zset":
			v = rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "list":
			v = rdb.LRange(ctx, k, 0, -1).Val()
		case "set":
			m := rdb.SMembers(ctx, k).Val()
			sort.Strings(m)
			v = m
		}
		out = append(out, fmt.Sprintf("%s (%s) = %v", k, typ, v))
	}
	return out
}

// globEscape escapes the characters special to a Redis MATCH pattern.
func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// serverMs returns the Redis server's clock in ms.
func serverMs(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// goneWithin waits up to d for the hold in key to be gone from Redis and
// reports whether it was: for a lock's hash, which a release does not
// delete (layout 3), for it to hold no hold; for a semaphore's holders
// hash, which outlives the holders (semaphore layout 4), for it to keep no
// holder record.
func goneWithin(t *testing.T, rdb *redis.Client, key string, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if strings.HasPrefix(key, "redisync:lock:") {
			if !heldOn(t, rdb, key) {
				return true
			}
		} else if len(semHolders(t, rdb, key)) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // poll interval of the condition
	}
}

// waitUpTo waits up to d for cond and reports whether it became true; for
// a condition the test can do without.
func waitUpTo(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond) // poll interval of the condition
	}
	return true
}

// within runs f in a goroutine and returns its error, failing the test if
// it has not returned after d.
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s: still running after %v", what, d)
	}
	panic("unreachable")
}

// proxiedClient returns a redisync Client whose go-redis client (and so
// each connection of its own) goes through px, with hook (if any) added to
// all of them (see withHook); both are closed when the test ends.
func proxiedClient(t *testing.T, px *redistest.Proxy, hook redis.Hook, opts ...redisync.Option) *redisync.Client {
	t.Helper()
	rdb := redistest.NewClient(t, px.Addr)
	if hook != nil {
		rdb.AddHook(hook)
		opts = append([]redisync.Option{withHook(hook)}, opts...)
	}
	c, err := redisync.New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
