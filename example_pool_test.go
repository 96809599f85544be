package redisync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redisync/redisync"
)

// runPool runs jobs on 4 workers. Each job first waits at most wait for a
// permit of the semaphore "export" (2 permits, shared by every host), and
// is handed back, to be tried again later, when none came in time. It
// returns the jobs handed back.
func runPool(ctx context.Context, client *redisync.Client, jobs []int, wait time.Duration, export func(job int)) []int {
	queue := make(chan int)
	var mu sync.Mutex
	var late []int
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			quota, err := client.NewSemaphore("export", 2) // one value per worker: each is a holder
			if err != nil {
				log.Fatal(err)
			}
			for job := range queue {
				err := runJob(ctx, quota, wait, func() { export(job) })
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					mu.Lock()
					late = append(late, job)
					mu.Unlock()
				case err != nil:
					log.Print(err)
				}
			}
		})
	}
	for _, job := range jobs {
		queue <- job
	}
	close(queue)
	wg.Wait()
	slices.Sort(late)
	return late
}

// runJob runs job while holding a permit of quota, waiting at most wait
// for it. An Acquire that times out leaves nothing behind: no permit and
// no place in the queue.
func runJob(ctx context.Context, quota *redisync.Semaphore, wait time.Duration, job func()) error {
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := quota.Acquire(actx, 1); err != nil {
		return err
	}
	// Release with ctx, not actx: actx may end while the job runs.
	defer quota.Release(ctx, 1)
	job()
	return nil
}

// A pool of workers limited by a semaphore shared across hosts, with a
// bound on how long a job waits for a permit.
func ExampleSemaphore_workerPool() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// Another host holds both permits for now.
	otherHost, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer otherHost.Close()
	theirs, err := otherHost.NewSemaphore("export", 2)
	if err != nil {
		log.Fatal(err)
	}
	if err := theirs.Acquire(ctx, 2); err != nil {
		log.Fatal(err)
	}

	var running, most atomic.Int64
	export := func(job int) {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond) // the export
		running.Add(-1)
	}

	late := runPool(ctx, client, []int{1, 2, 3, 4, 5, 6}, 50*time.Millisecond, export)
	fmt.Println("no permit within 50ms, handed back:", late)

	if err := theirs.Release(ctx, 2); err != nil {
		log.Fatal(err)
	}
	late = runPool(ctx, client, late, 10*time.Second, export)
	fmt.Println("tried again, handed back:", late)
	fmt.Println("never more than 2 exports at once:", most.Load() <= 2)
	// Output:
	// no permit within 50ms, handed back: [1 2 3 4 5 6]
	// tried again, handed back: []
	// never more than 2 exports at once: true
}
