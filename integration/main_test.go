// Package integration tests redisync against a real redis-server: expiry,
// scripts' atomicity under load, pub/sub and reconnects. See
// internal/redistest for how the server is found or started; without
// redis-server on PATH these tests fall back to Docker (internal/container).
package integration

import (
	"testing"

	"github.com/redisync/redisync/integration/internal/container"
	"github.com/redisync/redisync/internal/redistest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(redistest.Main(m, container.Redis),
		// After a dial fails, go-redis retries in a goroutine of its
		// pool that sleeps 1 s between tries and outlives Close by up to
		// that second: the cluster failover test makes dials fail.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		// Newer go-redis dials a new connection in a goroutine of its
		// pool, which goes on after its caller gave up and after Close:
		// through a failover client, it first asks every sentinel for
		// the primary (in goroutines of its own), for up to the dial
		// timeout.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).queuedNewConn"),
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).queuedNewConn.func2"),
		// A cluster client reloads its slot map in a goroutine that
		// waits 200 ms before it ends.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9.(*clusterStateHolder).LazyReload.func1"))
}
