package fault

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestStalledPrimaryDoesNotDelayHealthyRenewals: on a
// Redis Cluster, a primary that stops answering must not delay the
// watchdog's renewals of holds on the other primaries until they expire.
//
// A cluster of 3 primaries (no replicas: nothing fails over); one Client
// reaches each node through a proxy of its own, and holds 4 locks on each
// primary with a watchdog lease of 600 ms. After one lease of normal
// renewals, one primary's proxy is blackholed for three leases. The holds
// on the two other primaries must not be lost, and must still be in Redis.
// Where this does not hold, the renewals of the slots go one after the
// other, each waiting until its batch's first deadline, so the stalled
// primary's calls hold up the rest past their deadlines.
func TestStalledPrimaryDoesNotDelayHealthyRenewals(t *testing.T) {
	const lease = 600 * time.Millisecond
	cl := redistest.SpawnCluster(t, 3, 0)
	proxies := map[string]*redistest.Proxy{}
	for _, a := range cl.Addrs() {
		proxies[a] = redistest.NewProxy(t, a)
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: cl.Addrs(),
		// Every node, as the cluster announces it, is reached through its
		// proxy.
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if p := proxies[addr]; p != nil {
				addr = p.Addr
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := redisync.New(rdb, redisync.WithCrashTimeout(lease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	admin := cl.NewClient(t)

	// Four lock names on each primary.
	byPrimary := map[string][]string{}
	for i := 0; len(byPrimary) < 3 || minLen(byPrimary) < 4; i++ {
		name := fmt.Sprintf("%s-%d", redistest.Name(t), i)
		p := cl.PrimaryFor(t, admin, lockKey(name)).Addr
		if len(byPrimary[p]) < 4 {
			byPrimary[p] = append(byPrimary[p], name)
		}
	}
	held := map[string][]*redisync.Mutex{}
	for p, names := range byPrimary {
		for _, name := range names {
			m := must(c.NewMutex(name))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			held[p] = append(held[p], m)
		}
	}
	var stalled string
	for p := range byPrimary {
		stalled = p
		break
	}
	t.Cleanup(func() {
		// Before the Client is closed: let its calls fail fast.
		proxies[stalled].SetBlackhole(false)
		proxies[stalled].ResetAll()
	})

	// checkHealthy fails the test if a hold on a healthy primary is lost.
	checkHealthy := func(phase string, since time.Time) {
		t.Helper()
		for p, ms := range held {
			if p == stalled {
				continue
			}
			for _, m := range ms {
				if isClosed(m.Lost()) {
					t.Fatalf("%s: lock %s on healthy primary %s lost %v after the stall began (watchdog lease %v)",
						phase, m.Name(), p, time.Since(since).Round(time.Millisecond), lease)
				}
			}
		}
	}

	tick := time.NewTicker(5 * time.Millisecond) // sampling interval
	defer tick.Stop()
	start := time.Now()
	for time.Since(start) < lease { // one lease of normal renewals
		<-tick.C
		checkHealthy("before the stall", start)
	}
	proxies[stalled].SetBlackhole(true)
	stall := time.Now()
	for time.Since(stall) < 3*lease {
		<-tick.C
		checkHealthy("during the stall", stall)
	}
	lostStalled := 0
	for _, m := range held[stalled] {
		if isClosed(m.Lost()) {
			lostStalled++
		}
	}
	for p, ms := range held {
		if p == stalled {
			continue
		}
		for _, m := range ms {
			if !l3bHeld(t, admin, m.Name()) {
				t.Fatalf("lock %s on healthy primary %s: not held in Redis after the stall", m.Name(), p)
			}
		}
	}
	t.Logf("stalled primary %s for %v: its %d holds lost %d; the 8 holds on the healthy primaries kept",
		stalled, 3*lease, len(held[stalled]), lostStalled)
	for p, ms := range held {
		if p == stalled {
			continue
		}
		for _, m := range ms {
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// minLen returns the length of the shortest list in m.
func minLen(m map[string][]string) int {
	n := -1
	for _, l := range m {
		if n < 0 || len(l) < n {
			n = len(l)
		}
	}
	return n
}
