package redisserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of redis-server processes on loopback.
type Cluster struct {
	// Nodes are the servers, primaries first as redis-cli assigned them
	// at creation (roles change when a primary fails over).
	Nodes []*Server
}

// clusterTimeout bounds how long a new cluster may take to be ok.
const clusterTimeout = 30 * time.Second

// StartCluster starts primaries x (1 + replicas) servers of binary
// (redis-server) in cluster mode (node timeout 1 s, so that a failover
// takes a few seconds), joins them with cli (redis-cli) --cluster create,
// and waits until NotOK has nothing to say; extra are more arguments of
// every server. Stop stops them.
func StartCluster(binary, cli string, primaries, replicas int, extra ...string) (c *Cluster, err error) {
	c = &Cluster{}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0"}
	args = append(args, extra...)
	for range primaries * (1 + replicas) {
		s, err := start(freeClusterPort, binary, "", args...)
		if err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	create := append([]string{"--cluster", "create"}, c.Addrs()...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, create...).CombinedOutput(); err != nil {
		return c, fmt.Errorf("%s --cluster create: %w\n%s", cli, err, out)
	}
	for deadline := time.Now().Add(clusterTimeout); ; time.Sleep(50 * time.Millisecond) {
		why := c.NotOK()
		if why == "" {
			return c, nil
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("cluster not ok after %v: %s", clusterTimeout, why)
		}
	}
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, s := range c.Nodes {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

// Stop stops every node.
func (c *Cluster) Stop() error {
	var errs []error
	for _, s := range c.Nodes {
		errs = append(errs, s.Stop())
	}
	return errors.Join(errs...)
}

// NotOK says why the cluster is not ok yet, or "" when every running node
// reports cluster_state:ok and that every slot is served by a primary
// that runs, and every running replica is in sync with its primary (so
// that it can take over).
func (c *Cluster) NotOK() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, s := range c.Nodes {
		if !s.Running() {
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
			return s.Running()
		}
	}
	return false
}

// freeClusterPort returns a free loopback port whose cluster bus port
// (port + 10000) is free too.
func freeClusterPort() (int, error) {
	for range 100 {
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
	return 0, errors.New("redisserver: no free port pair for a cluster node")
}
