package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of redis-server processes of a test's own,
// on loopback.
type Cluster struct {
	// Nodes are the servers, primaries first as redis-cli assigned them
	// at creation (roles change when a test fails a primary over).
	Nodes []*Server
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
	c := &Cluster{}
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0"}
	for range primaries * (1 + replicas) {
		s, err := start(freeClusterPort, "", args...)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(s.stop)
		c.Nodes = append(c.Nodes, s)
	}
	create := []string{"--cluster", "create"}
	create = append(create, c.Addrs()...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", create...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK(tb, 30*time.Second)
	return c
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, s := range c.Nodes {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

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
		why := c.notOK()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("cluster not ok after %v: %s", d, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// notOK says why the cluster is not ok yet, or "" when it is.
func (c *Cluster) notOK() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, s := range c.Nodes {
		if !s.running() {
			continue
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		info, err := rdb.ClusterInfo(ctx).Result()
		var covered int
		var repl string
		if err == nil {
			repl, err = rdb.Info(ctx, "replication").Result()
		}
		if err == nil {
			var slots []redis.ClusterSlot
			slots, err = rdb.ClusterSlots(ctx).Result()
			for _, sl := range slots {
				if len(sl.Nodes) > 0 && c.runs(sl.Nodes[0].Addr) {
					covered += sl.End - sl.Start + 1
				}
			}
		}
		_ = rdb.Close()
		switch {
		case err != nil:
			return fmt.Sprintf("%s: %v", s.Addr, err)
		case !strings.Contains(info, "cluster_state:ok"):
			return s.Addr + ": cluster_state not ok"
		case strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up"):
			return s.Addr + ": replica not in sync"
		case covered != 16384:
			return fmt.Sprintf("%s: %d of 16384 slots served by running primaries", s.Addr, covered)
		}
	}
	return ""
}

// runs reports whether the node at addr is one of c's running servers.
func (c *Cluster) runs(addr string) bool {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s.running()
		}
	}
	return false
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

// freeClusterPort returns a free loopback port whose cluster bus port
// (port + 10000) is free too.
func freeClusterPort() (int, error) {
	for try := 0; try < 100; try++ {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		if port+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("redistest: no free port pair for a cluster node")
}
