package redistest

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redisserver"
)

// Cluster is a Redis Cluster of redis-server processes of a test's own,
// on loopback.
type Cluster struct {
	// Nodes are the servers, primaries first as redis-cli assigned them
	// at creation (roles change when a test fails a primary over).
	Nodes []*Server
	c     *redisserver.Cluster
}

// SpawnCluster starts primaries x (1 + replicas) redis-server processes in
// cluster mode (node timeout 1 s, so that a failover takes a few seconds),
// joins them with redis-cli --cluster create, and waits until every node
// reports the cluster ok. The processes are stopped when the test ends.
// It skips (or fails, under REDISYNC_REQUIRE_REDIS=1) without redis-server
// and redis-cli on PATH.
func SpawnCluster(tb testing.TB, primaries, replicas int) *Cluster {
	tb.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing(tb, "no "+bin+" on PATH for a cluster test")
		}
	}
	rc, err := redisserver.StartCluster("redis-server", "redis-cli", primaries, replicas)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = rc.Stop() })
	c := &Cluster{c: rc}
	for _, s := range rc.Nodes {
		c.Nodes = append(c.Nodes, wrap(s))
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string { return c.c.Addrs() }

// NewClient returns a cluster client, closed when the test ends.
func (c *Cluster) NewClient(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// WaitOK waits until every running node reports cluster_state:ok and
// agrees that every slot is served by a primary that runs, and every
// running replica is in sync with its primary (so that it can take over).
func (c *Cluster) WaitOK(tb testing.TB, d time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		why := c.c.NotOK()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("cluster not ok after %v: %s", d, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PrimaryFor returns the running server that serves key's slot.
func (c *Cluster) PrimaryFor(tb testing.TB, rdb *redis.ClusterClient, key string) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	node, err := rdb.MasterForKey(ctx, key)
	if err != nil {
		tb.Fatal(err)
	}
	addr := node.Options().Addr
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	tb.Fatalf("no node of the cluster at %s", addr)
	return nil
}
