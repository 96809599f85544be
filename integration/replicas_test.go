package integration

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// replicated starts a primary and a replica of it, in sync.
func replicated(t *testing.T) (primary, replica *redistest.Server) {
	t.Helper()
	primary = redistest.Spawn(t, "--repl-diskless-sync-delay", "0")
	replica = redistest.Spawn(t)
	rAdmin := redistest.NewClient(t, replica.Addr)
	host, port, _ := strings.Cut(primary.Addr, ":")
	if err := rAdmin.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	pAdmin := redistest.NewClient(t, primary.Addr)
	eventually(t, 10*time.Second, "the replica to sync", func() bool {
		return strings.Contains(rAdmin.Info(ctx, "replication").Val(), "master_link_status:up") &&
			strings.Contains(pAdmin.Info(ctx, "replication").Val(), "state=online")
	})
	return primary, replica
}

func TestReplicasAcknowledgeOrTheAcquireIsUndone(t *testing.T) {
	primary, replica := replicated(t)
	pAdmin, rAdmin := redistest.NewClient(t, primary.Addr), redistest.NewClient(t, replica.Addr)
	c, err := redisync.New(redistest.NewClient(t, primary.Addr), redisync.WithReplicas(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	for _, fair := range []bool{false, true} {
		var opts []redisync.Option
		if !fair {
			opts = append(opts, redisync.Barging())
		}
		name := redistest.Name(t)
		m := must(c.NewMutex(name, opts...))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		// Acknowledged: the replica has the hold the moment Lock returns.
		if st, now := lockStateOn(t, rAdmin, lockKey(name)); !st.Held(now) || st.Token != m.Token() {
			t.Fatalf("fair=%v: the replica lacks the hold (token %d) after Lock returned: %+v", fair, m.Token(), st)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Cut the replica off: no acknowledgement can come.
	if err := rAdmin.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the primary to lose its replica", func() bool {
		return strings.Contains(pAdmin.Info(ctx, "replication").Val(), "connected_slaves:0")
	})
	name := redistest.Name(t)
	m := must(c.NewMutex(name))
	if err := m.Lock(ctx); !errors.Is(err, redisync.ErrNotReplicated) {
		t.Fatalf("Lock without a replica: %v, want ErrNotReplicated", err)
	}
	if ok, err := m.TryLock(ctx); ok || !errors.Is(err, redisync.ErrNotReplicated) {
		t.Fatalf("TryLock without a replica: %v, %v, want ErrNotReplicated", ok, err)
	}
	if st, now := lockStateOn(t, pAdmin, lockKey(name)); st.Held(now) {
		t.Fatalf("an acquisition that was not replicated was left on the primary: %+v", st)
	}
	if m.Token() != 0 {
		t.Fatal("a failed Lock left a hold")
	}
}

func TestReplicatedHoldSurvivesFailover(t *testing.T) {
	primary, replica := replicated(t)
	rAdmin := redistest.NewClient(t, replica.Addr)
	c, err := redisync.New(redistest.NewClient(t, primary.Addr), redisync.WithReplicas(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	name := redistest.Name(t)
	m := must(c.NewMutex(name))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()

	primary.Kill(t)
	if err := rAdmin.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	oc, err := redisync.New(redistest.NewClient(t, replica.Addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = oc.Close() })
	other := must(oc.NewMutex(name))
	if ok, err := other.TryLock(ctx); ok || err != nil {
		t.Fatalf("after failover another owner took the lock: %v, %v", ok, err)
	}
	if st, now := lockStateOn(t, rAdmin, lockKey(name)); !st.Held(now) || st.Token != token {
		t.Fatalf("the promoted replica's lock state is %+v, want held with the holder's last token %d", st, token)
	}
}
