package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestSentinelFailoverKeepsReplicatedHold runs redisync on a Sentinel
// deployment (a primary, a replica, a sentinel) through go-redis's
// failover client. A hold taken with WithReplicas(1) survives a failover
// to the replica, and fair waiters that block across the failover all get
// the lock afterwards, in their order, with tokens that went on from the
// holder's.
func TestSentinelFailoverKeepsReplicatedHold(t *testing.T) {
	primary, replica := replicated(t)
	sentinel := redistest.SpawnSentinel(t, "mymaster", primary.Addr)
	sAdmin := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr})
	t.Cleanup(func() { _ = sAdmin.Close() })
	eventually(t, 20*time.Second, "the sentinel to know the replica", func() bool {
		rs, err := sAdmin.Replicas(ctx, "mymaster").Result()
		return err == nil && len(rs) == 1 && rs[0]["flags"] == "slave"
	})

	newFailover := func(opts ...redisync.Option) *redisync.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel.Addr}})
		t.Cleanup(func() { _ = rdb.Close() })
		c, err := redisync.New(rdb, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// The holder's acquisitions wait for the replica. The waiters' do not:
	// right after the failover the new primary has no replica until the
	// old one has rejoined it, and acquisitions that must be acknowledged
	// fail with ErrNotReplicated until then.
	cs := []*redisync.Client{newFailover(), newFailover()}
	admin := redistest.NewClient(t, primary.Addr)
	name := redistest.Name(t)
	holder := must(newFailover(redisync.WithReplicas(1, time.Second)).NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := holder.Token()
	var o order
	var dones []<-chan error
	for i := range 3 {
		dones = append(dones, queueWaiter(t, admin, name, must(cs[(i+1)%2].NewMutex(name)), ctx, i, &o, int64(i+1)))
	}

	if err := sAdmin.Failover(ctx, "mymaster").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the replica to be promoted", func() bool {
		addr, err := sAdmin.GetMasterAddrByName(ctx, "mymaster").Result()
		return err == nil && addr[0]+":"+addr[1] == replica.Addr
	})
	// Sentinel demotes the old primary a moment after promoting the
	// replica; until then both take writes (the window in which any
	// failover can grant a lock twice, see docs/deployment.md). Go on once
	// the old primary is a replica.
	eventually(t, 20*time.Second, "the old primary to be demoted", func() bool {
		return strings.Contains(admin.Info(ctx, "replication").Val(), "role:slave")
	})
	// The hold was acknowledged by the replica before Lock returned, so the
	// new primary has it.
	promoted := redistest.NewClient(t, replica.Addr)
	if st, now := lockStateOn(t, promoted, lockKey(name)); !st.Held(now) || st.Token != token {
		t.Fatalf("the promoted replica's lock state is %+v, want held by the holder, last token %d", st, token)
	}
	uctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		err := holder.Unlock(uctx)
		if err == nil {
			break
		}
		if uctx.Err() != nil {
			t.Fatalf("Unlock after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // the failover client is finding the new primary
	}
	for _, d := range dones {
		select {
		case err := <-d:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter is still blocked 30 s after the failover")
		}
	}
	if got := o.get(); len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Fatalf("acquisition order %v, want [0 1 2]", got)
	}
	if tk, _ := promoted.HGet(ctx, lockKey(name), schema.TokenField).Int64(); tk <= token {
		t.Fatalf("token counter %d on the new primary, want more than the holder's %d (three holds since)", tk, token)
	}
}
