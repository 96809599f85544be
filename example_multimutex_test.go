package redisync_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// A transfer between two accounts holds both at once. Transfers in both
// directions run together, each naming the accounts in its own order:
// the names are taken in one global order, so they cannot deadlock. Here,
// on an embedded Redis.
func ExampleMultiMutex() {
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
	balance := map[string]int{"acct:alice": 100, "acct:bob": 100}
	transfer := func(from, to string, amount int) error {
		both, err := client.NewMultiMutex([]string{from, to}) // one owner per transfer
		if err != nil {
			log.Fatal(err)
		}
		return both.Do(ctx, func(ctx context.Context) error {
			// Both accounts are held; a write to a store that checks
			// fencing tokens would carry both.Tokens().
			balance[from] -= amount
			balance[to] += amount
			return nil
		})
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			from, to := "acct:alice", "acct:bob"
			if i%2 == 1 {
				from, to = to, from
			}
			if err := transfer(from, to, 10); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(balance["acct:alice"], balance["acct:bob"])

	// A set that names an account twice is refused where it is made.
	_, err = client.NewMultiMutex([]string{"acct:alice", "acct:alice"})
	fmt.Println(errors.Is(err, redisync.ErrDuplicateName))
	// Output:
	// 100 100
	// true
}
