package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// clientCounts counts, in the clients of one run, what they send and
// what Redis pushes to them: a request is what a caller waits for (one
// command, or one pipeline or batch), and every command in it counts once.
type clientCounts struct {
	requests atomic.Int64
	commands atomic.Int64
	// background counts the requests of work a library does on its own,
	// outside the Lock and Unlock calls (see inCall).
	background atomic.Int64
	// deliveries counts the messages pushed to the clients (pushCounter).
	deliveries atomic.Int64
}

// add counts one request of n commands, made in the background or not.
func (c *clientCounts) add(n int, background bool) {
	c.requests.Add(1)
	c.commands.Add(int64(n))
	if background {
		c.background.Add(1)
	}
}

// countsAt are clientCounts' figures at one instant.
type countsAt struct{ requests, commands, background, deliveries int64 }

// snapshot reads the counts.
func (c *clientCounts) snapshot() countsAt {
	return countsAt{c.requests.Load(), c.commands.Load(), c.background.Load(), c.deliveries.Load()}
}

// callKey is the context key of a contender's callMarker.
type callKey struct{}

// A callMarker rides in the context a contender passes to Lock and Unlock,
// and says whether one of those calls is in progress. A request made with
// a context that carries a marker set is the call's own; a library that
// goes on using the context after the call returned (a keep-alive
// goroutine started by Lock) does so in the background.
type callMarker struct{ active atomic.Bool }

// marked returns ctx carrying a new marker, and the marker.
func marked(ctx context.Context) (context.Context, *callMarker) {
	m := new(callMarker)
	return context.WithValue(ctx, callKey{}, m), m
}

// inCall reports whether ctx carries a marker, and whether it is set.
func inCall(ctx context.Context) (carried, active bool) {
	m, ok := ctx.Value(callKey{}).(*callMarker)
	return ok, ok && m.active.Load()
}

// newGoRedis returns a go-redis client with default options that counts
// its requests, and the messages pushed to it, in counts. go-redis's
// pub/sub connections bypass hooks: their SUBSCRIBE and UNSUBSCRIBE are
// counted from the server instead. The handshake of a new connection
// (HELLO, CLIENT SETINFO), which goes through the hooks, is not counted:
// it is the pool's cost, not the lock's. A request is in the background
// when its context is not that of a Lock or Unlock call in progress: the
// watchdog of a library runs on a context of its own.
func newGoRedis(addr string, counts *clientCounts) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: goRedisDialer(counts)})
	rdb.AddHook(goRedisCounter{counts})
	return rdb
}

// newGoRedisCluster is newGoRedis for a Redis Cluster client seeded with
// addrs. The hook sits on the cluster client: a command counts once, even
// when it is redirected (MOVED), and a pipeline counts one request even
// when it is split over several primaries.
func newGoRedisCluster(addrs []string, counts *clientCounts) *redis.ClusterClient {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: goRedisDialer(counts)})
	rdb.AddHook(goRedisCounter{counts})
	return rdb
}

// goRedisCounter is a go-redis hook that counts requests.
type goRedisCounter struct{ counts *clientCounts }

// DialHook leaves dialing alone.
func (h goRedisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a request of one command.
func (h goRedisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			h.counts.add(1, goRedisBackground(ctx))
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a request of the pipeline's commands, the
// handshake's left out.
func (h goRedisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if !handshake(cmd) {
				n++
			}
		}
		if n > 0 {
			h.counts.add(n, goRedisBackground(ctx))
		}
		return next(ctx, cmds)
	}
}

// goRedisBackground reports whether a go-redis request made with ctx is
// in the background: no Lock or Unlock call is in progress on ctx.
func goRedisBackground(ctx context.Context) bool {
	_, active := inCall(ctx)
	return !active
}

// handshake reports whether cmd belongs to a new connection's set-up.
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

// countingRueidis wraps a rueidis client and counts a request per Do,
// DoCache, DoMulti or DoMultiCache call. rueidis pipelines concurrent
// calls on a shared connection, so a request here is what its caller
// waits for, not necessarily a network round trip of its own.
//
// It is rueidislock's client, whose keep-alive goroutine (one per held
// lock) sends its extensions with the context given to Lock, after Lock
// returned: those are its background requests. The same goroutine sends
// the release, while Unlock waits for it, with a context of its own
// (made from context.Background), so a request without a marker is
// counted as the call's.
type countingRueidis struct {
	rueidis.Client
	counts *clientCounts
}

// Do counts and forwards one command.
func (c countingRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.counts.add(1, rueidisBackground(ctx))
	return c.Client.Do(ctx, cmd)
}

// DoMulti counts and forwards one batch.
func (c countingRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.counts.add(len(cmds), rueidisBackground(ctx))
	return c.Client.DoMulti(ctx, cmds...)
}

// DoCache counts and forwards one cacheable command.
func (c countingRueidis) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	c.counts.add(1, rueidisBackground(ctx))
	return c.Client.DoCache(ctx, cmd, ttl)
}

// DoMultiCache counts and forwards one batch of cacheable commands.
func (c countingRueidis) DoMultiCache(ctx context.Context, cmds ...rueidis.CacheableTTL) []rueidis.RedisResult {
	c.counts.add(len(cmds), rueidisBackground(ctx))
	return c.Client.DoMultiCache(ctx, cmds...)
}

// rueidisBackground reports whether a rueidislock request made with ctx is
// in the background: ctx carries a marker, and the call it marks ended.
func rueidisBackground(ctx context.Context) bool {
	carried, active := inCall(ctx)
	return carried && !active
}
