package main

import (
	"context"
	"errors"
	"fmt"
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
// WithPlainPubSub) are shown as "0 process(es)", though they are
// subscribed on the very node that serves the lock.
func TestReview8StatusCountsPlainSubscribersOnCluster(t *testing.T) {
	cl := redistest.SpawnCluster(t, 3, 0)
	for _, barging := range []bool{true, false} {
		t.Run(fmt.Sprintf("barging=%v", barging), func(t *testing.T) {
			statusCountsPlainSubscriber(t, cl, barging)
		})
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

	node := redis.NewClient(&redis.Options{Addr: cl.PrimaryFor(t, crdb, k.Hash).Addr})
	t.Cleanup(func() { _ = node.Close() })
	waitFor(t, "the waiter to subscribe on the lock's primary", func() bool {
		return len(node.PubSubChannels(ctx, k.Channel+"*").Val()) == 1
	})

	st, err := readStatus(ctx, crdb, "redisync", name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lock.SubscribedProcesses != 1 {
		t.Errorf("status: %d subscribed processes; want 1 (the plain-pub/sub waiter)", st.Lock.SubscribedProcesses)
	}
}
