package redisync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redisync/redisync"
)

// whileHeld returns a context that ends when ctx ends or when m's current
// hold is lost, whichever comes first; after a loss, context.Cause reports
// ErrLockLost. Call it after Lock, and call cancel when the work is done.
func whileHeld(ctx context.Context, m *redisync.Mutex) (context.Context, context.CancelFunc) {
	lost := m.Lost() // the channel of the hold taken by the last Lock
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-lost:
			cancel(redisync.ErrLockLost)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// reindex stands for the work done under the lock: it writes a batch every
// 10 ms, passing the fencing token along, until ctx ends.
func reindex(ctx context.Context, token int64) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
			// Write the next batch with token; the store rejects
			// tokens lower than the highest it has seen.
		}
	}
}

// Work under a lock stops as soon as the lock is lost: the work runs under
// a context that Lost cancels, so every call it makes to a database or an
// API returns at once.
func ExampleMutex_Lost() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// A fixed lease of 100 ms that nobody renews stands in for a lease the
	// watchdog could not renew (Redis unreachable for longer than the
	// lease, say). Lost closes when it runs out, before Redis can give the
	// lock to anyone else.
	m, err := client.NewMutex("search-index", redisync.WithFixedLease(100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	work, cancel := whileHeld(ctx, m)
	err = reindex(work, m.Token())
	cancel()
	fmt.Println("reindex stopped, lock lost:", errors.Is(err, redisync.ErrLockLost))

	// Unlock reports the loss too. The next Lock of m takes the lock anew,
	// under a new fencing token.
	err = m.Unlock(ctx)
	fmt.Println("unlock, lock lost:", errors.Is(err, redisync.ErrLockLost))
	// Output:
	// reindex stopped, lock lost: true
	// unlock, lock lost: true
}
