package redisync_test

import (
	"context"
	"fmt"
	"log"

	"github.com/redisync/redisync"
)

// Who holds a lock, and who waits for it: what "redisync status" shows,
// read from Go in one read-only round trip.
func ExampleClient_InspectLock() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()

	client, err := redisync.New(rdb, redisync.WithLabel("reindexer-7"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	m, err := client.NewMutex("reindex")
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	defer m.Unlock(ctx)

	st, err := client.InspectLock(ctx, "reindex")
	if err != nil {
		log.Fatal(err)
	}
	if st.Held() {
		fmt.Printf("held by %s, our token: %v, %d queued\n",
			st.Holder.Label, st.Holder.Token == m.Token(), st.QueueLen)
	}
	// Output: held by reindexer-7, our token: true, 0 queued
}

// Who writes or reads a read-write lock, and who waits to.
func ExampleClient_InspectRWMutex() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()

	client, err := redisync.New(rdb, redisync.WithLabel("report-3"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	r1, err := client.NewRWMutex("catalog")
	if err != nil {
		log.Fatal(err)
	}
	r2, err := client.NewRWMutex("catalog")
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range []*redisync.RWMutex{r1, r2} {
		if err := r.RLock(ctx); err != nil {
			log.Fatal(err)
		}
		defer r.RUnlock(ctx)
	}

	st, err := client.InspectRWMutex(ctx, "catalog")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("writer: %v, readers: %d (%s), %d queued\n",
		st.Writer != nil, st.ReadersLen, st.Readers[0].Label, st.QueueLen)
	// Output: writer: false, readers: 2 (report-3), 0 queued
}

// Who leads an election, with which value, and who waits to lead.
func ExampleClient_InspectElection() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()

	client, err := redisync.New(rdb, redisync.WithLabel("scheduler-1"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	e, err := client.NewElection("scheduler")
	if err != nil {
		log.Fatal(err)
	}
	if err := e.Campaign(ctx, "10.0.0.1:8080"); err != nil {
		log.Fatal(err)
	}
	defer e.Resign(ctx)

	st, err := client.InspectElection(ctx, "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	if l := st.Leader; l != nil {
		fmt.Printf("led by %s at %s, our token: %v, %d candidates\n",
			l.Label, l.Value, l.Token == e.Token(), st.CandidatesLen)
	}
	// Output: led by scheduler-1 at 10.0.0.1:8080, our token: true, 0 candidates
}
