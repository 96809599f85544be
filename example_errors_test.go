package redisync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redisync/redisync"
)

// whatToDo tells redisync's errors apart with errors.Is, as a caller
// would: every error the package returns wraps one of its sentinels, a
// context error or an error from Redis.
func whatToDo(err error) string {
	switch {
	case err == nil:
		return "go on"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "gave up waiting: nothing is held, try again later"
	case errors.Is(err, redisync.ErrLockLost):
		return "the hold was lost: stop, another owner may have it"
	case errors.Is(err, redisync.ErrClosed):
		return "the Client is closed: shutting down"
	case errors.Is(err, redisync.ErrInvalid), errors.Is(err, redisync.ErrNotHeld):
		return "a bug in the caller: nothing was sent to Redis"
	case errors.Is(err, redisync.ErrWrongType), errors.Is(err, redisync.ErrSizeMismatch):
		return "Redis holds other data under this name: nothing was written"
	case errors.Is(err, redisync.ErrNotReplicated), errors.Is(err, redisync.ErrQuorum):
		return "too few replicas or nodes agreed: Lock holds nothing, try again later"
	default:
		return "an error from Redis (network, permissions, ...): try again later"
	}
}

// Each call below fails in a different way; errors.Is tells which.
func Example_errors() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	other, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()

	held, err := other.NewMutex("report")
	if err != nil {
		log.Fatal(err)
	}
	if err := held.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	m, err := client.NewMutex("report")
	if err != nil {
		log.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	fmt.Println("Lock, held elsewhere:", whatToDo(m.Lock(short)))
	fmt.Println("Unlock, not held:", whatToDo(m.Unlock(ctx)))

	_, err = client.NewMutex("")
	fmt.Println("empty name:", whatToDo(err))
	_, err = client.NewMutex("report", redisync.WithFixedLease(0))
	fmt.Println("lease of 0:", whatToDo(err))

	rdb.Set(ctx, "redisync:lock:{config}", "not a lock", 0)
	config, err := client.NewMutex("config")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("key of another type:", whatToDo(config.Lock(ctx)))

	client.Close()
	fmt.Println("after Close:", whatToDo(m.Lock(ctx)))
	// Output:
	// Lock, held elsewhere: gave up waiting: nothing is held, try again later
	// Unlock, not held: a bug in the caller: nothing was sent to Redis
	// empty name: a bug in the caller: nothing was sent to Redis
	// lease of 0: a bug in the caller: nothing was sent to Redis
	// key of another type: Redis holds other data under this name: nothing was written
	// after Close: the Client is closed: shutting down
}
