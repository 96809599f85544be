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
