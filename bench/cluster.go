package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redisync/redisync/internal/schema"

	"github.com/redisync/redisync/internal/redisserver"
)

// clusterPrimaries is the size of the cluster the cluster scenario runs on.
const clusterPrimaries = 3

// startCluster runs primaries redis-server processes (binary) in cluster
// mode on free loopback ports, joined by cli (redis-cli), no replicas.
// close stops them.
func startCluster(ctx context.Context, binary, cli string, primaries int) (*target, error) {
	c, err := redisserver.StartCluster(binary, cli, primaries, 0)
	if err != nil {
		return nil, err
	}
	t := &target{cluster: true}
	for _, proc := range c.Nodes {
		t.nodes = append(t.nodes, started(proc))
	}
	if err := t.loadOwners(ctx); err != nil {
		return nil, errors.Join(err, t.close(context.WithoutCancel(ctx), ""))
	}
	return t, nil
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
		if t.owner[schema.Slot(redisKey(cand))] == k%len(t.nodes) {
			return cand
		}
	}
}
