package main

import (
	"slices"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

func TestLockNamesOnePerPrimary(t *testing.T) {
	// Three primaries with redis-cli's even split of the slots.
	c := &target{cluster: true, nodes: make([]*server, 3), owner: make([]int, 16384)}
	for slot := range c.owner {
		c.owner[slot] = min(slot/5461, 2)
	}
	s := shape{keys: 6}
	for _, lib := range libraries() {
		names := lockNames(c, lib, s, "rsbench-x:cluster:96:"+lib.name+":0")
		if len(names) != s.keys || len(slices.Compact(slices.Clone(names))) != s.keys {
			t.Fatalf("%s: names %v, want %d different", lib.name, names, s.keys)
		}
		if lib.redisKey == nil {
			continue
		}
		for k, name := range names {
			if got := c.owner[schema.Slot(lib.redisKey(name))]; got != k%3 {
				t.Errorf("%s: lock %d (%s) is on primary %d, want %d", lib.name, k, name, got, k%3)
			}
		}
	}
}

func TestClusterScenarioOnlyWhenNamed(t *testing.T) {
	clustered := 0 // the libraries with a cluster client
	for _, lib := range libraries() {
		if lib.openCluster != nil {
			clustered++
		}
	}
	if clustered != len(libraries())-1 {
		t.Errorf("%d of %d libraries have a cluster client, want all but redisync-layout2", clustered, len(libraries()))
	}
	for _, tc := range []struct {
		scenarios string
		want      int // cluster jobs
	}{
		{"all", 0},
		{"hot", 0},
		{"cluster", clustered},
		{"hot,cluster", clustered},
	} {
		jobs, err := plan(options{libs: "all", scenarios: tc.scenarios, rounds: 1, settings: settings{base: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, j := range jobs {
			if j.cluster {
				got++
				if j.lib.openCluster == nil {
					t.Errorf("%s: cluster job of %s, which has no cluster client", tc.scenarios, j.lib.name)
				}
			}
		}
		if got != tc.want {
			t.Errorf("-scenarios %s: %d cluster jobs, want %d", tc.scenarios, got, tc.want)
		}
	}
}
