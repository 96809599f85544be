package redisync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// A semaphore of 2 permits limits how many jobs run at once, across every
// process that uses the name "gpu". Here, on an embedded Redis.
func ExampleSemaphore() {
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
	var running, most atomic.Int64
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			gpus, err := client.NewSemaphore("gpu", 2) // one holder per job
			if err != nil {
				log.Fatal(err)
			}
			if err := gpus.Acquire(ctx, 1); err != nil {
				fmt.Println(err)
				return
			}
			defer gpus.Release(ctx, 1)
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(10 * time.Millisecond) // the job
			running.Add(-1)
		})
	}
	wg.Wait()
	fmt.Println("never more than 2 jobs at once:", most.Load() <= 2)

	// A Semaphore made with another size for the same name works with
	// the stored size.
	other, err := client.NewSemaphore("gpu", 3)
	if err != nil {
		log.Fatal(err)
	}
	err = other.Acquire(ctx, 3)
	fmt.Println(errors.Is(err, redisync.ErrInvalidPermits), other.Size())
	// Output:
	// never more than 2 jobs at once: true
	// true 2
}

// TryAcquire takes permits only if it can at once: a job that must not
// wait skips its turn instead.
func ExampleSemaphore_TryAcquire() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	a, err := client.NewSemaphore("build-slots", 3)
	if err != nil {
		log.Fatal(err)
	}
	b, err := client.NewSemaphore("build-slots", 3) // another holder
	if err != nil {
		log.Fatal(err)
	}
	if err := a.Acquire(ctx, 2); err != nil {
		panic(err)
	}
	// TryAcquire never waits, and never queues: it also fails while
	// anyone is queued, so that it does not overtake a waiter.
	ok, err := b.TryAcquire(ctx, 2)
	fmt.Println("b takes 2 of the 1 free:", ok, err)
	ok, err = b.TryAcquire(ctx, 1)
	fmt.Println("b takes 1:", ok, err)
	fmt.Println("held by a and b:", a.Held(), b.Held())
	_ = b.Release(ctx, 1)
	_ = a.Release(ctx, 2)
	// Output:
	// b takes 2 of the 1 free: false <nil>
	// b takes 1: true <nil>
	// held by a and b: 2 1
}
