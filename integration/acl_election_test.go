package integration

import (
	"context"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestACLElection runs an election as a user restricted to the documented
// base ACL (no MULTI, no HGETALL): a campaign won, one waiting, an
// observer, a proclaim, a resignation handing over, Leader; and checks
// that the ACL refused nothing.
func TestACLElection(t *testing.T) {
	s := spawnACL(t)
	s.setUser(t, "redisync", aclBase)
	cs := s.aclClients(t, "redisync", 3)
	name := redistest.Name(t)
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	obs := observeChan(octx, must(cs[2].NewElection(name)))
	next := func() redisync.Leadership {
		t.Helper()
		select {
		case l := <-obs:
			return l
		case <-octx.Done():
			t.Fatal("no change observed")
		}
		return redisync.Leadership{}
	}
	next()
	a, b := must(cs[0].NewElection(name)), must(cs[1].NewElection(name))
	if err := a.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	next()
	won := make(chan error, 1)
	go func() { won <- b.Campaign(ctx, "b") }()
	if err := a.Proclaim(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	if l := next(); l.Value != "a2" {
		t.Fatalf("observed %+v, want a2", l)
	}
	eventually(t, 10*time.Second, "b to queue", func() bool {
		return waitingLen(t, s.admin, "redisync:elect:{"+name+"}") == 1
	})
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	if l := next(); l.Value != "b" {
		t.Fatalf("observed %+v, want b", l)
	}
	if l, err := must(cs[2].NewElection(name)).Leader(ctx); err != nil || l.Value != "b" {
		t.Fatalf("Leader = %+v, %v", l, err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	next()
	s.noDenials(t)
}
