package redisync_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// embeddedRedis starts an in-process Redis for the examples. A real
// program passes its own *redis.Client (or ClusterClient) to redisync.New.
func embeddedRedis() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, func() { _ = rdb.Close(); mr.Close() }
}

// A Mutex is shared by the goroutines it excludes, as a *sync.Mutex is,
// and excludes them from every other process that locks the same name.
func ExampleMutex() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()

	client, err := redisync.New(rdb) // one per process; shares one subscriber and one watchdog
	if err != nil {
		log.Fatal(err) // a nil rdb or a bad option; New does no I/O
	}
	defer client.Close()

	report, err := client.NewMutex("nightly-report") // one value, shared
	if err != nil {
		log.Fatal(err)
	}
	counter := 0
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := report.Lock(ctx); err != nil { // blocks until held or ctx ends
				log.Print(err)
				return
			}
			defer report.Unlock(ctx)
			counter++ // one goroutine at a time, in every process
		}()
	}
	wg.Wait()
	fmt.Println("counter:", counter)
	// Output: counter: 3
}

// While a lock is held, pass its fencing token to what it guards, and stop
// when it is lost.
func ExampleMutex_Token() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	m, err := client.NewMutex("nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("held with a fencing token:", m.Token() > 0)
	select {
	case <-m.Lost():
		fmt.Println("lost the lock: stop writing")
	default:
		fmt.Println("still held")
	}
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// held with a fencing token: true
	// still held
}

func ExampleMutex_TryLock() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	a, err := client.NewMutex("job")
	if err != nil {
		log.Fatal(err)
	}
	b, err := client.NewMutex("job")
	if err != nil {
		log.Fatal(err)
	}
	_ = a.Lock(ctx)
	ok, err := b.TryLock(ctx) // never waits
	fmt.Println("b got it while a holds it:", ok, err)
	_ = a.Unlock(ctx)
	ok, err = b.TryLock(ctx)
	fmt.Println("b got it after a let go:", ok, err)
	_ = b.Unlock(ctx)
	// Output:
	// b got it while a holds it: false <nil>
	// b got it after a let go: true <nil>
}

func Example_fair() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// Waiters of a Mutex are served in arrival order across every
	// process, and a release hands the lock straight to the next one.
	m, err := client.NewMutex("deploy")
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	defer m.Unlock(ctx)
	fmt.Println("deploying, fenced:", m.Token() > 0)
	// Output: deploying, fenced: true
}

func ExampleBarging() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// A barging Mutex takes a free lock at once, whoever waited longer:
	// Redisson's behaviour, for a lock that is rarely contended.
	m, err := client.NewMutex("cache-refresh", redisync.Barging())
	if err != nil {
		log.Fatal(err)
	}
	ok, err := m.TryLock(ctx)
	fmt.Println("took it:", ok, err)
	_ = m.Unlock(ctx)
	// Output: took it: true <nil>
}

// Do runs a function under the lock, with a context that ends the moment
// the hold is lost, and unlocks afterwards.
func ExampleMutex_Do() {
	rdb, stop := embeddedRedis()
	defer stop()
	ctx := context.Background()
	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	m, err := client.NewMutex("nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	err = m.Do(ctx, func(ctx context.Context) error {
		// Pass ctx to the work: it is cancelled, with context.Cause
		// ErrLockLost, if the lock is lost. A Do (or Lock) of m with it
		// re-enters the hold; any other Lock waits its turn.
		fmt.Println("reporting under the lock")
		return m.Do(ctx, func(ctx context.Context) error {
			fmt.Println("re-entered, same token")
			return ctx.Err()
		})
	})
	fmt.Println("done:", err)
	// Output:
	// reporting under the lock
	// re-entered, same token
	// done: <nil>
}
