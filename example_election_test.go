package redisync_test

import (
	"context"
	"fmt"
	"iter"
	"log"
	"time"

	"github.com/redisync/redisync"
)

// Two schedulers campaign to lead; the first leads while the second
// waits its turn. An observer follows who leads, pushed to it as it
// changes.
func ExampleElection() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	watch, cancel := context.WithCancel(ctx)
	defer cancel()
	observer, err := client.NewElection("scheduler")
	if err != nil {
		log.Fatal(err)
	}
	// Pull reads the observed states one at a time; a range loop over
	// Observe is the usual way.
	pull, stopObserving := iter.Pull2(observer.Observe(watch))
	defer stopObserving()
	next := func() redisync.Leadership {
		l, err, _ := pull()
		if err != nil {
			log.Fatal(err)
		}
		return l
	}
	fmt.Println("leads:", next().Leads()) // the state at first: nobody

	a, err := client.NewElection("scheduler") // one candidate per value
	if err != nil {
		log.Fatal(err)
	}
	if err := a.Campaign(ctx, "10.0.0.1:8080"); err != nil {
		log.Fatal(err)
	}
	// While a leads, its work runs under a.HoldContext, which ends if the
	// leadership is lost (a.Lost closes), and carries a.Token to the
	// resources it writes.
	fmt.Println("observed:", next().Value)

	b, err := client.NewElection("scheduler")
	if err != nil {
		log.Fatal(err)
	}
	won := make(chan error)
	go func() { won <- b.Campaign(ctx, "10.0.0.2:8080") }()

	if err := a.Proclaim(ctx, "10.0.0.1:9090"); err != nil { // moves, keeps leading
		log.Fatal(err)
	}
	fmt.Println("observed:", next().Value)

	// (For this example's output: let b join the queue of candidates
	// before a resigns, so that a hands the leadership to b.)
	for {
		s, err := client.InspectElection(ctx, "scheduler")
		if err != nil {
			log.Fatal(err)
		}
		if s.CandidatesLen > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}

	if err := a.Resign(ctx); err != nil { // b leads at once
		log.Fatal(err)
	}
	if err := <-won; err != nil {
		log.Fatal(err)
	}
	l := next()
	fmt.Println("observed:", l.Value, "with b's token:", l.Token == b.Token())
	leader, err := observer.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", leader.Value)
	if err := b.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// leads: false
	// observed: 10.0.0.1:8080
	// observed: 10.0.0.1:9090
	// observed: 10.0.0.2:8080 with b's token: true
	// leader: 10.0.0.2:8080
}
