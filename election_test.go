package redisync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// nextChange returns the next state sent by an observer, failing the test when
// none comes within 5 s or the stream ends.
func nextChange(t *testing.T, obs <-chan Leadership) Leadership {
	t.Helper()
	select {
	case l, ok := <-obs:
		if !ok {
			t.Fatal("the observer's stream ended")
		}
		return l
	case <-time.After(5 * time.Second):
		t.Fatal("no change observed within 5 s")
	}
	return Leadership{}
}

// noChange fails the test when the observer sends something within d.
func noChange(t *testing.T, obs <-chan Leadership, d time.Duration) {
	t.Helper()
	select {
	case l := <-obs:
		t.Fatalf("unexpected change %+v", l)
	case <-time.After(d):
	}
}

func TestElectionCampaignProclaimResign(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	c1, c2 := newClient(t, rdb), newClient(t, rdb)
	a, b := must(c1.NewElection(name)), must(c2.NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if _, err := a.Leader(ctx); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Leader of a new election: %v, want ErrNoLeader", err)
	}
	if err := a.Proclaim(ctx, "x"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Proclaim before Campaign: %v, want ErrNotLeader", err)
	}
	if err := a.Resign(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Resign before Campaign: %v, want ErrNotLeader", err)
	}
	obs := observeChan(ctx, must(c2.NewElection(name)))
	if l := nextChange(t, obs); l.Leads() || l.Gap {
		t.Fatalf("first state of a new election: %+v, want nobody leading, no gap", l)
	}

	if err := a.Campaign(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	l := nextChange(t, obs)
	if l.Value != "a1" || l.Token != a.Token() || l.Gap || a.Token() == 0 {
		t.Fatalf("observed %+v after a's campaign (token %d)", l, a.Token())
	}
	if got, err := b.Leader(ctx); err != nil || got.Value != "a1" || got.Token != a.Token() || got.Revision != l.Revision {
		t.Fatalf("Leader = %+v, %v; want a1, token %d, revision %d", got, err, a.Token(), l.Revision)
	}

	won := make(chan error, 1)
	go func() { won <- b.Campaign(ctx, "b1") }()
	eventually(t, 5*time.Second, "b queued", func() bool {
		n, _ := rdb.LLen(ctx, schema.ElectionKeys("redisync", name).Queue).Result()
		return n == 1
	})
	if err := a.Proclaim(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	if p := nextChange(t, obs); p.Value != "a2" || p.Token != l.Token || p.Revision <= l.Revision || p.Gap {
		t.Fatalf("observed %+v after Proclaim, want a2 with token %d after revision %d", p, l.Token, l.Revision)
	}
	if err := a.Proclaim(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	nb := nextChange(t, obs) // not a2 again: proclaiming the same value is no change
	if nb.Value != "b1" || nb.Token != b.Token() || nb.Token <= l.Token {
		t.Fatalf("observed %+v after a resigned, want b1 with token %d > %d", nb, b.Token(), l.Token)
	}
	if a.Token() != 0 || a.Lost() != notHeld {
		t.Fatal("a still leads after Resign")
	}
	// A Campaign of the leading value without its leadership's context
	// is a candidate as any other: it waits while the value leads.
	wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := b.Campaign(wctx, "b3"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second Campaign of the leader: %v, want it to wait until its deadline", err)
	}
	wcancel()
	hctx, hcancel := b.HoldContext(ctx)
	if err := b.Campaign(hctx, "b2"); err != nil { // with the leadership's context: proclaims
		t.Fatal(err)
	}
	hcancel()
	if p := nextChange(t, obs); p.Value != "b2" || p.Token != nb.Token {
		t.Fatalf("observed %+v after b campaigned again, want b2 with token %d", p, nb.Token)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if p := nextChange(t, obs); p.Leads() {
		t.Fatalf("observed %+v after the last leader resigned, want nobody", p)
	}
	noChange(t, obs, 100*time.Millisecond)
}

// TestElectionTryCampaign: TryCampaign leads a free election, reports
// false at once and queues nothing while another leads, proclaims under
// its own leadership's context, and leads again once the leader resigned.
func TestElectionTryCampaign(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	c1, c2 := newClient(t, rdb), newClient(t, rdb)
	a, b := must(c1.NewElection(name)), must(c2.NewElection(name))
	queue := schema.ElectionKeys("redisync", name).Queue
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if ok, err := a.TryCampaign(ctx, "a1"); !ok || err != nil || a.Token() == 0 {
		t.Fatalf("TryCampaign of a free election: %v, %v, token %d; want true", ok, err, a.Token())
	}
	if l, err := b.Leader(ctx); err != nil || l.Value != "a1" || l.Token != a.Token() {
		t.Fatalf("Leader = %+v, %v; want a1 with token %d", l, err, a.Token())
	}
	if ok, err := b.TryCampaign(ctx, "b1"); ok || err != nil || b.Token() != 0 {
		t.Fatalf("TryCampaign while a leads: %v, %v; want false", ok, err)
	}
	if n := rdb.LLen(ctx, queue).Val(); n != 0 {
		t.Fatalf("%d candidates queued after a TryCampaign that failed; want none", n)
	}
	hctx, hcancel := a.HoldContext(ctx)
	if ok, err := a.TryCampaign(hctx, "a2"); !ok || err != nil {
		t.Fatalf("TryCampaign under a's leadership: %v, %v; want true", ok, err)
	}
	hcancel()
	if l, err := b.Leader(ctx); err != nil || l.Value != "a2" {
		t.Fatalf("Leader = %+v, %v; want a2 proclaimed", l, err)
	}
	first := a.Token()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryCampaign(ctx, "b2"); !ok || err != nil || b.Token() <= first {
		t.Fatalf("TryCampaign after a resigned: %v, %v, token %d; want true and a token above %d", ok, err, b.Token(), first)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := must(c1.NewElection(name)).TryCampaign(ctx, strings.Repeat("v", MaxMetadataLen+1)); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("TryCampaign with a long value: %v, want ErrInvalidValue", err)
	}
}

func TestElectionInvalid(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb)
	ctx := context.Background()
	long := strings.Repeat("v", MaxMetadataLen+1)
	if err := must(c.NewElection("e")).Campaign(ctx, long); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("Campaign with a long value: %v", err)
	}
	if _, err := c.NewElection(""); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("NewElection with an empty name: %v", err)
	}
	if _, err := c.NewElection("e", WithKeyPrefix("{")); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("NewElection with a bad prefix: %v", err)
	}
}

// TestElectionLostLeadership: a leader whose hold is removed behind its
// back hears it as a lost hold: Proclaim says ErrLockLost and Lost closes.
func TestElectionLostLeadership(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	c := newClient(t, rdb)
	e := must(c.NewElection(name))
	ctx := context.Background()
	if err := e.Campaign(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := e.HoldContext(ctx)
	defer cancel()
	rdb.Del(ctx, schema.ElectionKeys("redisync", name).Hash)
	if err := e.Proclaim(ctx, "w"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Proclaim after the hold was removed: %v, want ErrLockLost", err)
	}
	select {
	case <-e.Lost():
	default:
		t.Fatal("Lost not closed")
	}
	if !errors.Is(context.Cause(hctx), ErrLockLost) {
		t.Fatalf("hold context's cause %v", context.Cause(hctx))
	}
	if err := e.Resign(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Resign after the loss: %v, want ErrLockLost", err)
	}
	if err := e.Campaign(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	if l, err := e.Leader(ctx); err != nil || l.Value != "again" {
		t.Fatalf("Leader = %+v, %v", l, err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestElectionObserveGap: a change whose message is lost is reported as a
// gap, followed at once by the current leader; a stale or duplicated
// message is ignored.
func TestElectionObserveGap(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	c := newClient(t, rdb)
	e := must(c.NewElection(name))
	k := schema.ElectionKeys("redisync", name)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	obs := observeChan(ctx, must(c.NewElection(name)))
	nextChange(t, obs)
	if err := e.Campaign(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	first := nextChange(t, obs)

	// A duplicate of the last change, and one older: ignored.
	dup := fmt.Sprintf("%d:%d:%d:%d:v1", first.Revision, first.Revision-1, first.Token, 1000)
	old := fmt.Sprintf("%d:%d:%d:%d:old", first.Revision-5, first.Revision-6, first.Token, 1000)
	rdb.Publish(ctx, k.Changes, dup)
	rdb.Publish(ctx, k.Changes, old)
	noChange(t, obs, 100*time.Millisecond)

	// A change made without its message (as if pub/sub lost it), then
	// one whose message arrives: the observer sees the gap and reads the
	// current state.
	rev := first.Revision + 1
	rdb.HSet(ctx, k.Hash, schema.RevField, rev)
	rdb.HSet(ctx, k.Hash, schema.MetaField, "v2")
	if err := e.Proclaim(ctx, "v3"); err != nil {
		t.Fatal(err)
	}
	g := nextChange(t, obs)
	if !g.Gap || g.Value != "v3" || g.Revision <= rev {
		t.Fatalf("observed %+v after a lost change, want v3 marked as following a gap", g)
	}
	if err := e.Proclaim(ctx, "v4"); err != nil {
		t.Fatal(err)
	}
	if l := nextChange(t, obs); l.Gap || l.Value != "v4" {
		t.Fatalf("observed %+v, want v4 without a gap", l)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	nextChange(t, obs)
}

// TestElectionObserveReconnect: changes made while the observer's
// subscription is down are reported once it is back, as a gap followed by
// the current leader.
func TestElectionObserveReconnect(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	watcher := newClient(t, redistest.NewClient(t, proxy.Addr))
	c := newClient(t, rdb)
	e := must(c.NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	obs := observeChan(ctx, must(watcher.NewElection(name)))
	nextChange(t, obs)
	if err := e.Campaign(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	first := nextChange(t, obs)

	proxy.SetBlackhole(true) // messages go nowhere now
	if err := e.Proclaim(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(ctx, "v3"); err != nil {
		t.Fatal(err)
	}
	noChange(t, obs, 50*time.Millisecond)
	proxy.ResetAll() // the connection is cut: the subscriber dials again
	proxy.SetBlackhole(false)
	g := nextChange(t, obs)
	if !g.Gap || g.Value != "v3" || g.Revision <= first.Revision {
		t.Fatalf("observed %+v after the reconnect, want v3 marked as following a gap", g)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l := nextChange(t, obs); l.Leads() || l.Gap {
		t.Fatalf("observed %+v after Resign, want nobody, no gap", l)
	}
}

// TestElectionRedisRestart: Redis restarts without persistence under a
// leader and an observer. The leader learns it lost leadership (Lost
// closes); the observer, once subscribed again, reports that nobody leads,
// as following a gap; a new campaign leads with a token larger than the
// lost leader's, and the observer sees it.
func TestElectionRedisRestart(t *testing.T) {
	srv := redistest.Spawn(t, "--save", "", "--appendonly", "no")
	name := redistest.Name(t)
	opts := []Option{WithCrashTimeout(300 * time.Millisecond)}
	leader := newClient(t, redistest.NewClient(t, srv.Addr), opts...)
	watcher := newClient(t, redistest.NewClient(t, srv.Addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs := observeChan(ctx, must(watcher.NewElection(name)))
	nextChange(t, obs)
	e := must(leader.NewElection(name))
	if err := e.Campaign(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	first := nextChange(t, obs)
	lost := e.Lost()

	srv.Kill(t)
	srv.Restart(t)
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader was not told it lost leadership")
	}
	if g := nextChange(t, obs); !g.Gap || g.Leads() {
		t.Fatalf("observed %+v after the restart, want nobody leading, after a gap", g)
	}
	if err := e.Resign(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Resign of the lost leadership: %v, want ErrLockLost", err)
	}
	if err := e.Campaign(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	if l := nextChange(t, obs); l.Value != "after" || l.Token <= first.Token {
		t.Fatalf("observed %+v after the new campaign, want after with a token above %d", l, first.Token)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	nextChange(t, obs)
}

// TestElectionObserveExpiry: a leader whose lease runs out with no
// successor is announced by no script; the observer looks when the lease
// was due to end, and reports nobody leading, under the same revision.
func TestElectionObserveExpiry(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	c := newClient(t, rdb)
	e := must(c.NewElection(name, WithFixedLease(200*time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	obs := observeChan(ctx, must(c.NewElection(name)))
	nextChange(t, obs)
	if err := e.Campaign(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	l := nextChange(t, obs)
	start := time.Now()
	gone := nextChange(t, obs)
	t.Logf("expiry observed %v after the change", time.Since(start).Round(time.Millisecond))
	if gone.Leads() || gone.Gap || gone.Revision != l.Revision || time.Since(start) > time.Second {
		t.Fatalf("observed %+v after %+v's lease ran out, want nobody, same revision, within 1 s", gone, l)
	}
	select {
	case <-e.Lost():
	default:
		t.Fatal("the leader's Lost is open after its lease ran out")
	}
	if err := e.Resign(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Resign after the lease ran out: %v", err)
	}
}

// TestElectionObserveSlowReader: an observer whose reader falls more than
// 256 changes behind drops them and reports the current state, as
// following a gap, then goes on with the changes after it.
func TestElectionObserveSlowReader(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	c := newClient(t, rdb)
	e := must(c.NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	obs := observeChan(ctx, must(c.NewElection(name)))
	nextChange(t, obs)
	// A second observer, not read either until the changes are made,
	// overflows as the first does: the subscriber hands each message to
	// every listener of the channel in turn, so by the time it reports
	// the last value, the first observer has heard at least 256 changes.
	fast := observeChan(ctx, must(c.NewElection(name)))
	nextChange(t, fast)
	if err := e.Campaign(ctx, "v0"); err != nil {
		t.Fatal(err)
	}
	// The reader takes nothing while 300 changes are made: the observer
	// blocks sending the first, and its inbox overflows.
	const changes = 300
	for i := 1; i <= changes; i++ {
		if err := e.Proclaim(ctx, fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for l := nextChange(t, fast); l.Value != fmt.Sprintf("v%d", changes); l = nextChange(t, fast) {
	}
	var got []Leadership
	for {
		l := nextChange(t, obs)
		got = append(got, l)
		if l.Value == fmt.Sprintf("v%d", changes) {
			break
		}
	}
	checkObserved(t, "observer", got)
	if len(got) > changes-watchInbox || countGaps(got) != 1 {
		t.Fatalf("observed %d states (%d after a gap) for %d changes, want fewer than %d and one gap",
			len(got), countGaps(got), changes+1, changes-watchInbox)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// Goroutine A leads and loses its leadership; goroutine B of the same
// value campaigns: it waits for the Resign that A owes, which returns
// ErrLockLost and never resigns B's leadership.
func TestElectionResignOwedToALostLeadershipSparesTheNext(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	e := must(newClient(t, rdb).NewElection(name))
	ctx := context.Background()
	if err := e.Campaign(ctx, "a"); err != nil { // goroutine A
		t.Fatal(err)
	}
	rdb.Del(ctx, schema.ElectionKeys("redisync", name).Hash)
	if err := e.Proclaim(ctx, "a2"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Proclaim: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := e.Campaign(wctx, "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("B's Campaign while A owes its Resign: %v, want it to wait until its deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Campaign(ctx, "b") }() // goroutine B
	// A's `defer e.Resign(ctx)` runs now.
	if err := e.Resign(ctx); !errors.Is(err, ErrLockLost) {
		t.Errorf("A's Resign owed to its lost leadership: %v, want ErrLockLost", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	bToken := e.Token()
	if l, err := e.Leader(ctx); err != nil || l.Value != "b" || e.Token() != bToken {
		t.Errorf("B's leadership after A's Resign: %+v, %v (token %d, want %d)", l, err, e.Token(), bToken)
	}
	_ = e.Resign(ctx)
}

// A candidate that campaigns again without resigning its lost leadership
// waits for that Resign, its own, until its ctx ends; meanwhile it holds
// nothing in Redis, and another candidate leads.
func TestElectionCampaignOwingAResignKeepsNobodyOut(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	e := must(newClient(t, rdb).NewElection(name))
	other := must(newClient(t, rdb).NewElection(name))
	if err := e.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, schema.ElectionKeys("redisync", name).Hash) // the leadership is lost
	if err := e.Proclaim(ctx, "a2"); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Proclaim after the loss: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	again := make(chan error, 1)
	go func() { again <- e.Campaign(actx, "a-again") }() // no Resign first
	octx, ocancel := context.WithTimeout(ctx, time.Second)
	defer ocancel()
	if err := other.Campaign(octx, "b"); err != nil {
		t.Fatalf("another candidate, while the first campaigns again owing its Resign: %v", err)
	}
	if l, err := other.Leader(ctx); err != nil || l.Value != "b" {
		t.Fatalf("Leader: %+v, %v; want b", l, err)
	}
	if err := other.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-again; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the Campaign owing its own Resign: %v, want it to wait until its deadline", err)
	}
	if err := e.Resign(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Resign of the lost leadership: %v, want ErrLockLost", err)
	}
}
