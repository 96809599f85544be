package integration

import (
	"context"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestClusterElection runs elections whose slots are on every primary of
// a Redis Cluster: changes are published with SPUBLISH by the scripts and
// heard by observers through sharded subscriptions, one per primary. Each
// observer must see the first leader, the hand-off to the second
// candidate and the resignation, in order and without a gap.
func TestClusterElection(t *testing.T) {
	c := redistest.SpawnCluster(t, 3, 0)
	cs := clusterClients(t, c, 3)
	names := namesOnEveryPrimary(t, c, c.NewClient(t), 3)
	octx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, name := range names {
		obs := observeChan(octx, must(cs[2].NewElection(name)))
		next := func() redisync.Leadership {
			t.Helper()
			select {
			case l := <-obs:
				if l.Gap {
					t.Errorf("%s: observed %+v, a gap", name, l)
				}
				return l
			case <-octx.Done():
				t.Fatalf("%s: no change observed", name)
			}
			return redisync.Leadership{}
		}
		next()
		a, b := must(cs[0].NewElection(name)), must(cs[1].NewElection(name))
		if err := a.Campaign(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if l := next(); l.Value != "a" || l.Token != a.Token() {
			t.Fatalf("%s: observed %+v, want a", name, l)
		}
		won := make(chan error, 1)
		go func() { won <- b.Campaign(ctx, "b") }()
		eventually(t, 10*time.Second, "b to queue", func() bool {
			st, err := cs[2].InspectElection(ctx, name)
			return err == nil && st.CandidatesLen == 1
		})
		if err := a.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-won; err != nil {
			t.Fatal(err)
		}
		if l := next(); l.Value != "b" || l.Token != b.Token() {
			t.Fatalf("%s: observed %+v, want b", name, l)
		}
		if err := b.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if l := next(); l.Leads() {
			t.Fatalf("%s: observed %+v, want nobody", name, l)
		}
	}
}
