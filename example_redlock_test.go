package redisync_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

func ExampleRedlock() {
	ctx := context.Background()
	// Three independent Redis deployments (not replicas of one another).
	var nodes []redis.UniversalClient
	for range 3 {
		rdb, stop := embeddedRedis()
		defer stop()
		nodes = append(nodes, rdb)
	}

	rl, err := redisync.NewRedlock(nodes) // one per process
	if err != nil {
		log.Fatal(err) // no nodes, a nil one, the same twice, a bad option
	}
	defer rl.Close()

	m, err := rl.NewMutex("ledger") // one value per owner, as with Mutex
	if err != nil {
		log.Fatal(err)
	}
	switch err := m.Lock(ctx); {
	case errors.Is(err, redisync.ErrQuorum):
		// Fewer than a majority of the nodes answered: which, and why.
		var failed *redisync.NodeErrors
		if errors.As(err, &failed) {
			for _, n := range failed.Nodes {
				log.Printf("node %d: %v", n.Node, n.Err)
			}
		}
		log.Fatal(err)
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println("held on a quorum of", rl.Quorum(), "nodes, with a fencing token:", m.Token() > 0)

	// Pass m.Token() with every write; the resource rejects tokens lower
	// than the highest it has seen. Stop when the hold is lost.
	select {
	case <-m.Lost():
		fmt.Println("lost: a majority of node holds is gone")
	default:
		fmt.Println("still held")
	}
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// held on a quorum of 2 nodes, with a fencing token: true
	// still held
}
