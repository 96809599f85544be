package redisync

import (
	"context"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// Observers and Proclaim of an Election under lost messages, late
// commands and rollbacks.

// A state read with revision 0 (the election's {rev} field lost, as when a
// rollback or a restart from an older snapshot left a hash without it) is
// reported as following a gap, since 0 proves nothing: an observer cut off
// while x handed to y and y to z, with the revision lost under x and again
// under z, reports z with Gap, never as if it followed x.
func TestElectionObserveForgottenRevisionIsAGap(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	k := schema.ElectionKeys("redisync", name)
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	watcher := newClient(t, redistest.NewClient(t, proxy.Addr))
	opts := []Option{WithCrashTimeout(300 * time.Millisecond)}
	x := must(newClient(t, rdb, opts...).NewElection(name))
	y := must(newClient(t, rdb, opts...).NewElection(name))
	z := must(newClient(t, rdb, opts...).NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	obs := observeChan(ctx, must(watcher.NewElection(name)))
	nextChange(t, obs)
	if err := x.Campaign(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if l := nextChange(t, obs); l.Value != "x" {
		t.Fatalf("got %+v", l)
	}
	// The revision is lost under x.
	rdb.HDel(ctx, k.Hash, schema.RevField)
	// The observer's expiry reads (one per lease) see revision 0, same state.
	noChange(t, obs, time.Second)

	proxy.SetBlackhole(true)
	yWon := make(chan error, 1)
	go func() { yWon <- y.Campaign(ctx, "y") }()
	eventually(t, 5*time.Second, "y queued", func() bool {
		n, _ := rdb.LLen(ctx, k.Queue).Result()
		return n == 1
	})
	if err := x.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-yWon; err != nil {
		t.Fatal(err)
	}
	zWon := make(chan error, 1)
	go func() { zWon <- z.Campaign(ctx, "z") }()
	eventually(t, 5*time.Second, "z queued", func() bool {
		n, _ := rdb.LLen(ctx, k.Queue).Result()
		return n == 1
	})
	if err := y.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-zWon; err != nil {
		t.Fatal(err)
	}
	// Lost again under z, while the observer is cut off.
	rdb.HDel(ctx, k.Hash, schema.RevField)
	proxy.ResetAll()
	proxy.SetBlackhole(false)
	l := nextChange(t, obs)
	t.Logf("observed after reconnect: %+v", l)
	if l.Value == "z" && !l.Gap {
		t.Errorf("y's leadership was skipped without Gap: observed %+v", l)
	}
	_ = z.Resign(ctx)
}

// A Proclaim abandoned by its ctx (a stalled connection) that reaches
// Redis after a later Proclaim changes nothing: the value stays the later
// one.
func TestElectionLateProclaimChangesNothing(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	c := newClient(t, redistest.NewClient(t, proxy.Addr))
	e := must(c.NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.Campaign(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(ctx, "v1b"); err != nil { // loads the script
		t.Fatal(err)
	}
	obs := observeChan(ctx, must(newClient(t, rdb).NewElection(name)))
	nextChange(t, obs)

	held, release := proxy.HoldNext("late-v2")
	pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := e.Proclaim(pctx, "late-v2")
	pcancel()
	<-held
	t.Logf("Proclaim(late-v2): %v", err)
	if err := e.Proclaim(ctx, "v3"); err != nil {
		t.Fatal(err)
	}
	if l := nextChange(t, obs); l.Value != "v3" {
		t.Fatalf("observed %+v", l)
	}
	release()
	// The late copy reaches Redis within a few ms on loopback: it must
	// announce nothing and leave v3 (before the fix it announced
	// late-v2, which the leader never believed).
	noChange(t, obs, 500*time.Millisecond)
	if got, err := e.Leader(ctx); err != nil || got.Value != "v3" {
		t.Errorf("Leader = %+v, %v; the leader's last successful Proclaim was v3", got, err)
	}
	_ = e.Resign(ctx)
}

// Changes heard before a resubscription are dropped for the state read
// after it: when Redis rolled back (a failover to a lagging replica, a
// restart from an older snapshot), a slow observer does not end on a
// change the rollback undid.
func TestElectionObserveResyncDropsWhatWasHeardBefore(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	k := schema.ElectionKeys("redisync", name)
	c := newClient(t, rdb)
	e := must(c.NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wc := newClient(t, redistest.Client(t))
	slow := observeChan(ctx, must(wc.NewElection(name)))
	nextChange(t, slow)
	fast := observeChan(ctx, must(wc.NewElection(name)))
	nextChange(t, fast)
	if err := e.Campaign(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	nextChange(t, slow)
	nextChange(t, fast)
	if err := e.Proclaim(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	c1 := nextChange(t, fast)
	if err := e.Proclaim(ctx, "v3"); err != nil {
		t.Fatal(err)
	}
	nextChange(t, fast) // slow has heard v3 too: it is in its inbox
	// Roll back to C1 (as a failover to a replica that missed C2 would).
	rdb.HSet(ctx, k.Hash, schema.RevField, c1.Revision)
	rdb.HSet(ctx, k.Hash, schema.MetaField, "v2")
	rdb.ClientKillByFilter(ctx, "TYPE", "pubsub")
	if l := nextChange(t, fast); l.Value != "v2" || !l.Gap {
		t.Fatalf("fast observed %+v", l)
	}
	var got []Leadership
	got = append(got, nextChange(t, slow)) // v2, blocked since before
	select {
	case l := <-slow:
		got = append(got, l)
	case <-time.After(300 * time.Millisecond):
	}
	st, _ := e.Leader(ctx)
	t.Logf("slow observed %+v; Redis says %q", got, st.Value)
	if last := got[len(got)-1]; last.Value != st.Value {
		t.Errorf("slow observer's last state %+v is not Redis's (%q), and it was sent after the resync", last, st.Value)
	}
	_ = e.Resign(ctx)
}
