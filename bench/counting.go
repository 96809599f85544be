package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// clientCounts counts, in the clients of one run, what they send: a
// request is what a caller waits for (one command, or one pipeline or
// batch), and every command in it counts once.
type clientCounts struct {
	requests atomic.Int64
	commands atomic.Int64
}

// add counts one request of n commands.
func (c *clientCounts) add(n int) {
	c.requests.Add(1)
	c.commands.Add(int64(n))
}

// newGoRedis returns a go-redis client with default options that counts
// its requests in counts. go-redis's pub/sub connections bypass hooks:
// their SUBSCRIBE and UNSUBSCRIBE are counted from the server instead.
// The handshake of a new connection (HELLO, CLIENT SETINFO), which goes
// through the hooks, is not counted: it is the pool's cost, not the lock's.
func newGoRedis(addr string, counts *clientCounts) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	rdb.AddHook(goRedisCounter{counts})
	return rdb
}

// newGoRedisCluster is newGoRedis for a Redis Cluster client seeded with
// addrs. The hook sits on the cluster client: a command counts once, even
// when it is redirected (MOVED), and a pipeline counts one request even
// when it is split over several primaries.
func newGoRedisCluster(addrs []string, counts *clientCounts) *redis.ClusterClient {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
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
			h.counts.add(1)
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
			h.counts.add(n)
		}
		return next(ctx, cmds)
	}
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
type countingRueidis struct {
	rueidis.Client
	counts *clientCounts
}

// Do counts and forwards one command.
func (c countingRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.counts.add(1)
	return c.Client.Do(ctx, cmd)
}

// DoMulti counts and forwards one batch.
func (c countingRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.counts.add(len(cmds))
	return c.Client.DoMulti(ctx, cmds...)
}

// DoCache counts and forwards one cacheable command.
func (c countingRueidis) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	c.counts.add(1)
	return c.Client.DoCache(ctx, cmd, ttl)
}

// DoMultiCache counts and forwards one batch of cacheable commands.
func (c countingRueidis) DoMultiCache(ctx context.Context, cmds ...rueidis.CacheableTTL) []rueidis.RedisResult {
	c.counts.add(len(cmds))
	return c.Client.DoMultiCache(ctx, cmds...)
}
