package main

import (
	"context"
	"errors"
	"strings"
)

// A target is the Redis a run measures: one server, or the primaries of a
// Redis Cluster. Its server-side figures (commands, CPU, connections) are
// summed over all of its servers.
type target struct {
	nodes   []*server
	cluster bool
	// owner[slot] is the index in nodes of the primary that serves slot;
	// set for a cluster.
	owner []int
}

// single is the target of one server.
func single(s *server) *target { return &target{nodes: []*server{s}} }

// addrs returns the servers' addresses.
func (t *target) addrs() []string {
	var addrs []string
	for _, s := range t.nodes {
		addrs = append(addrs, s.addr)
	}
	return addrs
}

// snapshot reads the counters of every server and sums them.
func (t *target) snapshot(ctx context.Context) (counters, error) {
	var sum counters
	for _, s := range t.nodes {
		c, err := s.snapshot(ctx)
		if err != nil {
			return counters{}, err
		}
		sum = sum.add(c)
	}
	return sum, nil
}

// clients returns the client connections of every server summed, the
// benchmark's own (one per server) excluded.
func (t *target) clients(ctx context.Context) (int, error) {
	sum := 0
	for _, s := range t.nodes {
		n, err := s.clients(ctx)
		if err != nil {
			return 0, err
		}
		sum += n - 1
	}
	return sum, nil
}

// leftovers sums server.leftovers over every server.
func (t *target) leftovers(ctx context.Context, name string) (withTTL int64, persistent []string, err error) {
	for _, s := range t.nodes {
		n, keys, err := s.leftovers(ctx, name)
		if err != nil {
			return 0, nil, err
		}
		withTTL += n
		persistent = append(persistent, keys...)
	}
	return withTTL, persistent, nil
}

// version names the first server and its version.
func (t *target) version(ctx context.Context) string { return t.nodes[0].version(ctx) }

// close closes every server (see server.close).
func (t *target) close(ctx context.Context, pattern string) error {
	var errs []error
	for _, s := range t.nodes {
		errs = append(errs, s.close(ctx, pattern))
	}
	return errors.Join(errs...)
}

// String names the target for the progress output.
func (t *target) String() string {
	if t.cluster {
		return "cluster of " + strings.Join(t.addrs(), ",")
	}
	return t.nodes[0].addr
}
