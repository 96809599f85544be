package redisync_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redisync/redisync"
)

// sendSIGTERM sends this process SIGTERM, as "kill PID", "docker stop" or
// Kubernetes would. Where a process cannot signal itself (Windows), it
// calls stop instead, which ends the context as the signal would.
func sendSIGTERM(stop context.CancelFunc) {
	p, err := os.FindProcess(os.Getpid())
	if err == nil {
		err = p.Signal(syscall.SIGTERM)
	}
	if err != nil {
		stop()
	}
}

// A service that holds a lock until it is told to stop shuts its Client
// down on SIGTERM: Shutdown releases every hold of the Client in Redis, so
// that another replica takes over at once instead of after the lease (15 s
// by default). Shutdown waits until its ctx ends, at most; a hold not
// released by then is freed by Redis when its lease runs out, and the
// error says which.
func Example_gracefulShutdown() {
	rdb, stopRedis := embeddedRedis()
	defer stopRedis()

	// SIGTERM or Ctrl-C ends ctx.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	client, err := redisync.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	m, err := client.NewMutex("singleton-cron")
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err) // a signal while Lock waits ends it with ctx's error
	}
	fmt.Println("leader: running the job")

	sendSIGTERM(stop) // here the example signals itself
	select {
	case <-ctx.Done():
		fmt.Println("SIGTERM: shutting down")
	case <-m.Lost():
		fmt.Println("lock lost: stopping")
	}

	// Shutdown closes the Lost channel of every hold still held (work
	// that watches it stops), then releases the holds in Redis. Calls of
	// the Client after it return ErrClosed.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Shutdown(sctx); err != nil {
		log.Print(err) // what it could not release runs out within its lease
	}

	next, err := redisync.New(rdb) // another replica
	if err != nil {
		log.Fatal(err)
	}
	defer next.Close()
	again, err := next.NewMutex("singleton-cron")
	if err != nil {
		log.Fatal(err)
	}
	ok, err := again.TryLock(context.Background())
	fmt.Println("next replica takes over at once:", ok, err)
	// Output:
	// leader: running the job
	// SIGTERM: shutting down
	// next replica takes over at once: true <nil>
}
