package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// clusterPrimaries is the size of the cluster the cluster scenario runs on.
const clusterPrimaries = 3

// startCluster runs primaries redis-server processes in cluster mode on
// free loopback ports, joins them with cli (redis-cli) --cluster create,
// no replicas, and waits until every node reports the cluster ok. close
// stops them.
func startCluster(ctx context.Context, binary, cli string, primaries int) (t *target, err error) {
	t = &target{cluster: true}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.close(context.WithoutCancel(ctx), ""))
		}
	}()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "1000", "--repl-diskless-sync-delay", "0"}
	for range primaries {
		port, err := freeClusterPort()
		if err != nil {
			return t, err
		}
		s, err := spawn(ctx, binary, port, args...)
		if err != nil {
			return t, err
		}
		t.nodes = append(t.nodes, s)
	}
	create := append([]string{"--cluster", "create"}, t.addrs()...)
	create = append(create, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, create...).CombinedOutput(); err != nil {
		return t, fmt.Errorf("%s --cluster create: %w\n%s", cli, err, out)
	}
	if err := t.waitClusterOK(ctx); err != nil {
		return t, err
	}
	return t, t.loadOwners(ctx)
}

// waitClusterOK waits until every node says cluster_state:ok.
func (t *target) waitClusterOK(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*startTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		why := ""
		for _, s := range t.nodes {
			info, err := s.admin.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				why = fmt.Sprintf("%s: cluster_state not ok (%v)", s.addr, err)
				break
			}
		}
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ok: %s", why)
		case <-tick.C:
		}
	}
}

// loadOwners fills t.owner from CLUSTER SLOTS, and fails unless every slot
// is served by one of t's nodes.
func (t *target) loadOwners(ctx context.Context) error {
	slots, err := t.nodes[0].admin.ClusterSlots(ctx).Result()
	if err != nil {
		return err
	}
	index := map[string]int{}
	for i, s := range t.nodes {
		index[s.addr] = i
	}
	t.owner = make([]int, 16384)
	for i := range t.owner {
		t.owner[i] = -1
	}
	for _, sl := range slots {
		if len(sl.Nodes) == 0 {
			continue
		}
		i, ok := index[sl.Nodes[0].Addr]
		if !ok {
			return fmt.Errorf("cluster: slots %d-%d served by %s, not a node of ours", sl.Start, sl.End, sl.Nodes[0].Addr)
		}
		for slot := sl.Start; slot <= sl.End; slot++ {
			t.owner[slot] = i
		}
	}
	for slot, i := range t.owner {
		if i < 0 {
			return fmt.Errorf("cluster: slot %d has no primary", slot)
		}
	}
	return nil
}

// lockName returns the name of the k-th of a run's locks called after key.
// On a cluster it is key:k:n with the smallest n whose Redis key, as
// redisKey gives it, lives on primary k modulo the primaries, so that the
// locks are dealt evenly to the primaries whatever a library does with the
// name.
func (t *target) lockName(key string, k int, redisKey func(string) string) string {
	name := fmt.Sprintf("%s:%d", key, k)
	if !t.cluster || redisKey == nil {
		return name
	}
	for n := 0; ; n++ {
		cand := name + ":" + strconv.Itoa(n)
		if t.owner[slotOf(redisKey(cand))] == k%len(t.nodes) {
			return cand
		}
	}
}

// slotOf returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of
// the key's hash tag (the part between the first '{' and the next '}',
// when not empty) or of the whole key, modulo 16384. (A copy of the root
// package's.)
func slotOf(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % 16384)
}

// freeClusterPort returns a loopback port that was free a moment ago and
// whose cluster bus port (port + 10000) was free too.
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
	return 0, errors.New("no free port pair for a cluster node")
}
