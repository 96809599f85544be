package redisync

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithReplicas makes every acquisition wait until at least n replicas of
// the primary have acknowledged it (WAIT n timeout, on the connection that
// ran the acquire script), so that a failover to one of them keeps the
// hold and its fencing token. When fewer acknowledge within timeout, the
// acquisition is undone and the call fails with ErrNotReplicated. A lock
// or permits handed over by a release are confirmed the same way, with a
// round trip of the new holder's own.
//
// WAIT is not consensus: an acknowledged write can still be lost (a
// replica that acknowledged may not be the one promoted, and replicas
// acknowledge receipt, not persistence). It narrows the window in which a
// failover grants a lock twice; it does not close it. See
// docs/deployment.md.
// n must be in [1, 100] and timeout in [1ms, MaxLease]. It applies to the
// primitives of one deployment (a Mutex, RWMutex, Semaphore, MultiMutex,
// Election), and to New as their default; not to a Redlock.
//
// The default is not to wait for replicas.
func WithReplicas(n int, timeout time.Duration) Option {
	return option("WithReplicas", local, func(cfg *config) {
		if n < 1 || n > 100 {
			cfg.invalid("replicas %d is outside [1, 100]", n)
			return
		}
		if cfg.checkDuration("replica timeout", timeout) {
			cfg.replicas, cfg.replicaTimeout = n, timeout
		}
	})
}

// runAcked runs script and returns its reply as integers. With
// WithReplicas, it runs on a connection of its own to the primary that
// serves the script's first key and, when granted says the reply took
// something, waits for the replicas on that connection; too few
// acknowledgements fail with ErrNotReplicated, which is not a reply from
// Redis, so the caller undoes the acquisition as it would after a lost
// reply.
func (c *Client) runAcked(ctx context.Context, cfg config, script scriptCall, granted func([]int64) bool) ([]int64, error) {
	if cfg.replicas == 0 {
		return script.run(ctx, c.rdb).Int64Slice()
	}
	node, err := c.primary(ctx, script.keys[0])
	if err != nil {
		return nil, err
	}
	conn := node.Conn()
	defer conn.Close()
	res, err := script.run(ctx, conn).Int64Slice()
	if err != nil || !granted(res) {
		return res, err
	}
	acked, err := conn.Wait(ctx, cfg.replicas, cfg.replicaTimeout).Result()
	if err != nil {
		return nil, err
	}
	if acked < int64(cfg.replicas) {
		return nil, fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, acked, cfg.replicas, cfg.replicaTimeout)
	}
	return res, nil
}

// primary returns the client of the server that serves key: one whose
// Conn is a connection of its own to that server.
func (c *Client) primary(ctx context.Context, key string) (interface{ Conn() *redis.Conn }, error) {
	if c.cluster != nil {
		return c.cluster.MasterForKey(ctx, key)
	}
	return c.rdb.(nodeClient), nil // see classify
}
