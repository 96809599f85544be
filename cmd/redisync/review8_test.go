package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// Review 8, finding 5. On a Redis Cluster, status counted the processes
// subscribed to a lock's channel both ways (PUBSUB NUMSUB and
// SHARDNUMSUB), since it cannot know whether the lock's users run with
// WithPlainPubSub. Through InspectLock it counts SHARDNUMSUB only: the
// waiters of a plain-pub/sub deployment (Redis Cluster before 7, or
// WithPlainPubSub) are shown as "0 process(es)". Later (CI at 984c03b):
// it asked only the node that serves the lock, but go-redis connects a
// plain subscriber to any node, so status counted it one time in three.
func TestReview8StatusCountsPlainSubscribersOnCluster(t *testing.T) {
	cl := redistest.SpawnCluster(t, 3, 0)
	for _, barging := range []bool{true, false} {
		t.Run(fmt.Sprintf("barging=%v", barging), func(t *testing.T) {
			statusCountsPlainSubscriber(t, cl, barging)
		})
	}
	t.Run("on another node", func(t *testing.T) { statusCountsSubscriberElsewhere(t, cl) })
}

// statusCountsSubscriberElsewhere subscribes to a lock's channel with
// plain pub/sub on a node that does not serve the lock, as go-redis may
// connect a plain subscriber, and checks that status counts it.
func statusCountsSubscriberElsewhere(t *testing.T, cl *redistest.Cluster) {
	crdb := cl.NewClient(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.LockKeys("redisync", name)
	primary := cl.PrimaryFor(t, crdb, k.Hash).Addr
	var other string
	for _, n := range cl.Nodes {
		if n.Addr != primary {
			other = n.Addr
			break
		}
	}
	node := redis.NewClient(&redis.Options{Addr: other})
	t.Cleanup(func() { _ = node.Close() })
	ps := node.Subscribe(ctx, k.Channel)
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	st, err := readStatus(ctx, crdb, "redisync", name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lock.SubscribedProcesses != 1 {
		t.Errorf("status: %d subscribed processes; want 1 (a plain subscriber on %s, the lock on %s)",
			st.Lock.SubscribedProcesses, other, primary)
	}
}

// statusCountsPlainSubscriber has a waiter with plain pub/sub wait for a
// lock on cl, barging (on the lock's channel) or fair (on its grant
// channel), and checks that status counts its process.
func statusCountsPlainSubscriber(t *testing.T, cl *redistest.Cluster, barging bool) {
	crdb := cl.NewClient(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.LockKeys("redisync", name)
	opts := []redisync.ClientOption{redisync.WithPlainPubSub()}
	if barging {
		opts = append(opts, redisync.Barging())
	}

	holder, err := redisync.New(crdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close() })
	m := holder.NewMutex(name)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Unlock(ctx) }()

	waiter, err := redisync.New(cl.NewClient(t), append(opts, redisync.WithRecheck(time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = waiter.Close() })
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- waiter.NewMutex(name).Lock(lctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("waiter: %v", err)
		}
	}()

	// A plain subscriber may be connected to any node of the cluster
	// (PUBLISH reaches them all): wait until one node has it.
	waitFor(t, "the waiter to subscribe on a node", func() bool {
		var n atomic.Int64
		err := crdb.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			n.Add(int64(len(node.PubSubChannels(ctx, k.Channel+"*").Val())))
			return nil
		})
		return err == nil && n.Load() == 1
	})

	st, err := readStatus(ctx, crdb, "redisync", name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lock.SubscribedProcesses != 1 {
		t.Errorf("status: %d subscribed processes; want 1 (the plain-pub/sub waiter)", st.Lock.SubscribedProcesses)
	}
}
