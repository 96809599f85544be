package redisync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// A read-write lock guards a configuration that many processes read and
// one at a time rewrites. Here, on an embedded Redis.
func ExampleRWMutex() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Readers share the lock.
	r1, err := client.NewRWMutex("config")
	if err != nil {
		log.Fatal(err)
	}
	r2, err := client.NewRWMutex("config")
	if err != nil {
		log.Fatal(err)
	}
	if err := r1.RLock(ctx); err != nil {
		log.Fatal(err)
	}
	ok, _ := r2.TryRLock(ctx)
	fmt.Println("two readers at once:", ok)

	// A writer waits for them; readers that come after it queue behind it.
	w, err := client.NewRWMutex("config")
	if err != nil {
		log.Fatal(err)
	}
	ok, _ = w.TryLock(ctx)
	fmt.Println("writer beside readers:", ok)
	_ = r1.RUnlock(ctx)
	_ = r2.RUnlock(ctx)

	// The write has a fencing token, and reads too, through its context.
	_ = w.Do(ctx, func(ctx context.Context) error {
		fmt.Println("the write has a fencing token:", w.Token() > 0)
		fmt.Println("a read under the write:", w.RLock(ctx) == nil)
		return w.RUnlock(ctx)
	})

	// A read's context refuses a write: an upgrade could deadlock.
	_ = r1.RDo(ctx, func(ctx context.Context) error {
		fmt.Println(errors.Is(r1.Lock(ctx), redisync.ErrUpgrade))
		return nil
	})
	// Output:
	// two readers at once: true
	// writer beside readers: false
	// the write has a fencing token: true
	// a read under the write: true
	// true
}
