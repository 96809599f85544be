package redisync_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// Locker is an application's own interface for an exclusive lock: the
// core methods that Mutex, RWMutex (its write), MultiMutex and RedMutex
// share. redisync does not export it; code that takes a Locker works with
// any of them.
type Locker interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) (bool, error)
	Unlock(ctx context.Context) error
	Token() int64
	Lost() <-chan struct{}
	HoldContext(parent context.Context) (context.Context, context.CancelFunc)
	Do(ctx context.Context, fn func(ctx context.Context) error) error
	Extend(ctx context.Context, lease time.Duration) error
	TTL(ctx context.Context) (time.Duration, error)
}

// The compiler checks that each exclusive primitive is a Locker.
var (
	_ Locker = (*redisync.Mutex)(nil)
	_ Locker = (*redisync.RWMutex)(nil)
	_ Locker = (*redisync.MultiMutex)(nil)
	_ Locker = (*redisync.RedMutex)(nil)
)

// A job that runs under any Locker: one lock on one Redis, the write of a
// read-write lock, several locks at once, or a lock on a quorum of Redis
// nodes. It asks for more time
// than its fixed lease, and reads what is left.
func Example_locker() {
	ctx := context.Background()
	rdb, stop := embeddedRedis()
	defer stop()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	var nodes []redis.UniversalClient
	for range 3 {
		node, stop := embeddedRedis()
		defer stop()
		nodes = append(nodes, node)
	}
	rl, err := redisync.NewRedlock(nodes)
	if err != nil {
		log.Fatal(err)
	}
	defer rl.Close()

	lease := redisync.WithFixedLease(10 * time.Second)
	one, err := client.NewMutex("report", lease)
	if err != nil {
		log.Fatal(err)
	}
	write, err := client.NewRWMutex("config", lease)
	if err != nil {
		log.Fatal(err)
	}
	both, err := client.NewMultiMutex([]string{"acct:alice", "acct:bob"}, lease)
	if err != nil {
		log.Fatal(err)
	}
	quorum, err := rl.NewMutex("ledger", lease)
	if err != nil {
		log.Fatal(err)
	}

	job := func(l Locker) error {
		return l.Do(ctx, func(ctx context.Context) error {
			if err := l.Extend(ctx, time.Minute); err != nil {
				return err // the hold was lost, or Redis failed
			}
			ttl, err := l.TTL(ctx)
			if err != nil {
				return err
			}
			fmt.Println("held with a fencing token:", l.Token() > 0, "for over 50s:", ttl > 50*time.Second)
			return nil
		})
	}
	for _, l := range []Locker{one, write, both, quorum} {
		if err := job(l); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// held with a fencing token: true for over 50s: true
	// held with a fencing token: true for over 50s: true
	// held with a fencing token: true for over 50s: true
	// held with a fencing token: true for over 50s: true
}
