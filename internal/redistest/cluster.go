package redistest

import (
	"context"
	"os/exec"
	"strings"
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
// reports the cluster ok; args are more arguments of every server. The processes are stopped when the test ends.
// It skips (or fails, under REDISYNC_REQUIRE_REDIS=1) without redis-server
// and redis-cli on PATH.
func SpawnCluster(tb testing.TB, primaries, replicas int, args ...string) *Cluster {
	tb.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing(tb, "no "+bin+" on PATH for a cluster test")
		}
	}
	rc, err := redisserver.StartCluster("redis-server", "redis-cli", primaries, replicas, args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = rc.Stop() })
	path, _ := exec.LookPath("redis-server")
	note(rc.Nodes[0].Addr, path)
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

// MigrateSlot moves the hash slot of key from the primary that serves it
// to the primary to, as redis-cli --cluster reshard does and while clients
// go on using it: it marks the slot importing on to and migrating on its
// primary, has between run after each step of the move (nil: nothing), moves
// the slot's keys one at a time (MIGRATE), and then gives the slot to to on
// every primary. Meanwhile a command on a key of the slot is redirected
// (ASK), or refused with TRYAGAIN when its keys are split between the two.
func (c *Cluster) MigrateSlot(tb testing.TB, rdb *redis.ClusterClient, key string, to *Server, between func()) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from := c.PrimaryFor(tb, rdb, key)
	if from == to {
		tb.Fatalf("redistest: %s serves the slot of %s already", to.Addr, key)
	}
	node := func(s *Server) *redis.Client {
		n := redis.NewClient(&redis.Options{Addr: s.Addr})
		tb.Cleanup(func() { _ = n.Close() })
		return n
	}
	src, dst := node(from), node(to)
	n, err := src.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		tb.Fatal(err)
	}
	slot := int(n)
	srcID, err := src.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		tb.Fatal(err)
	}
	dstID, err := dst.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		tb.Fatal(err)
	}
	step := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
		if between != nil {
			between()
		}
	}
	step(dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	step(src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	host, port, _ := strings.Cut(to.Addr, ":")
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1).Result()
		if err != nil {
			tb.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		// A key that expired or was deleted since it was listed is
		// NOKEY: the next listing goes on without it.
		if err := src.Do(ctx, "MIGRATE", host, port, keys[0], 0, 5000).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			tb.Fatal(err)
		}
		step(nil)
	}
	// The new owner first, then the old one, then every other primary,
	// as redis-cli does.
	step(dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	step(src.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	for _, s := range c.Nodes {
		if s == from || s == to || !s.s.Running() {
			continue
		}
		n := node(s)
		if role, _ := n.Do(ctx, "ROLE").Slice(); len(role) > 0 && role[0] == "master" {
			step(n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
		}
	}
	// rdb learns the new slot map: PrimaryFor then names to.
	for ; ; time.Sleep(10 * time.Millisecond) {
		rdb.ReloadState(ctx)
		if node, err := rdb.MasterForKey(ctx, key); err == nil && node.Options().Addr == to.Addr {
			return
		}
		if ctx.Err() != nil {
			tb.Fatalf("redistest: the client does not see %s serve the slot of %s", to.Addr, key)
		}
	}
}
