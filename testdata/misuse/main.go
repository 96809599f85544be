// Command misuse gives options where they do not apply: it must not
// compile (TestOptionMisuseDoesNotCompile checks each line is refused).
package main

import (
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync"
)

func main() {
	c, _ := redisync.New(redis.NewClient(&redis.Options{}))
	r, _ := redisync.NewRedlock(nil)
	c.NewSemaphore("s", 1, redisync.Barging())          // misuse: barging
	c.NewMutex("m", redisync.WithPlainPubSub())         // misuse: plain
	_, _ = redisync.NewRedlock(nil, redisync.Barging()) // misuse: redlock-barging
	c.NewMutex("m", redisync.WithNodeTimeout(1))        // misuse: node-timeout
	c.NewSemaphore("s", 1, redisync.WithMetadata("x"))  // misuse: metadata
	r.NewMutex("m", redisync.WithObserver(nil))         // misuse: observer
}
