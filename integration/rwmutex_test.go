package integration

import (
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestRWMutexWaitersDoNotPoll: readers and writers blocked behind a
// writer, on two Clients, send nothing to Redis while they wait (no
// heartbeat or recheck is due in the window); the release that ends the
// write then serves them all in turn.
func TestRWMutexWaitersDoNotPoll(t *testing.T) {
	const waiters = 10
	name := redistest.Name(t)
	cs := newClients(t, 2, redisync.WithRecheck(time.Hour), redisync.WithWaiterTimeout(time.Minute))
	holder := must(cs[0].NewRWMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, waiters)
	for i := range waiters {
		rw := must(cs[i%2].NewRWMutex(name))
		go func() {
			var err error
			if i%3 == 0 {
				if err = rw.Lock(ctx); err == nil {
					err = rw.Unlock(ctx)
				}
			} else if err = rw.RLock(ctx); err == nil {
				err = rw.RUnlock(ctx)
			}
			done <- err
		}()
	}
	queue := schema.RWMutexKeys(schema.DefaultPrefix, name).Queue
	rdb := admin(t)
	cnt := cmdCounter{rdb}
	eventually(t, 5*time.Second, "every waiter to queue", func() bool { return rdb.ZCard(ctx, queue).Val() == waiters })
	last := cnt.total(t)
	eventually(t, 5*time.Second, "the waiters to stop sending commands (are they polling?)", func() bool {
		time.Sleep(100 * time.Millisecond)
		now := cnt.total(t)
		quiet := now-last <= 2
		last = now
		return quiet
	})
	busy := func() int64 {
		return cnt.total(t) - callsOf(t, cnt, "info") - callsOf(t, cnt, "ping")
	}
	before := busy()
	window := time.NewTimer(3 * time.Second) // the measurement, not a wait for a condition
	<-window.C
	if n := busy() - before; n > 0 {
		t.Fatalf("%d commands in 3 s while %d readers and writers were blocked", n, waiters)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiters were not served")
		}
	}
}
