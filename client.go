package redisync

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Client creates locks and semaphores on one Redis deployment. It owns the
// two background goroutines that all of them share: the subscriber (one
// pub/sub connection through which every waiter is woken) and the watchdog
// (which renews every held lease and heartbeats every fair waiter, in
// batches). Both start when first needed.
//
// A Client is safe for concurrent use. Close it when done.
type Client struct {
	rdb redis.UniversalClient
	cfg config
	id  string        // prefix of every owner id minted by this Client
	seq atomic.Uint64 // last owner number

	sub     *subscriber
	wd      *watchdog
	publish string // the scripts' publish command: PUBLISH, or SPUBLISH when sharded

	ctx   context.Context // ends when the Client is closed
	close context.CancelFunc
}

// New returns a Client that uses rdb (a *redis.Client, *redis.ClusterClient
// or *redis.Ring; the Client never closes it). The options become the
// defaults of every Mutex and Semaphore created by the Client. New does no
// I/O; a nil rdb or an invalid option makes every later call fail with
// ErrNilClient or ErrInvalidOption.
//
// On a *redis.ClusterClient, waiters are woken through sharded pub/sub
// (SPUBLISH and SSUBSCRIBE, Redis 7 and later): each primary delivers the
// messages of its own slots, on one connection per primary that serves a
// lock with waiters. WithPlainPubSub turns it off for older clusters.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	c := &Client{
		rdb:     rdb,
		cfg:     defaultConfig().with(opts),
		id:      uuid.NewString(),
		publish: "PUBLISH",
	}
	c.ctx, c.close = context.WithCancel(context.Background())
	cluster, _ := rdb.(*redis.ClusterClient)
	if cluster != nil && !c.cfg.plain {
		c.publish = "SPUBLISH"
	} else {
		cluster = nil
	}
	c.sub = newSubscriber(rdb, cluster, c.ctx)
	c.wd = newWatchdog(rdb, c.ctx)
	return c
}

// Close stops the subscriber and the watchdog and waits for them to exit.
// Waiting calls return ErrClosed; later calls fail with ErrClosed. Holds are
// not released: their leases are no longer renewed, so Redis frees them
// when they run out, and their Lost channels are closed. Close is
// idempotent and always returns nil.
func (c *Client) Close() error {
	c.close()
	c.sub.wait()
	c.wd.wait()
	return nil
}

// usable reports why the Client cannot be used, if it cannot.
func (c *Client) usable() error {
	switch {
	case c.rdb == nil:
		return ErrNilClient
	case c.ctx.Err() != nil:
		return ErrClosed
	}
	return nil
}

// newOwner mints an owner id unique to this Client value.
func (c *Client) newOwner() string {
	return c.id + "-" + strconv.FormatUint(c.seq.Add(1), 10)
}

// cleanupTimeout bounds the clean-up a call does after its context ended.
const cleanupTimeout = 5 * time.Second

// detached returns a context for clean-up after ctx ended: it keeps ctx's
// values, not its cancellation.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// persist runs call, an idempotent script call (a release), again while it
// fails because Redis cannot be reached or cannot serve for now (a
// restart, a failover: see transient), with a growing pause, for at most
// cleanupTimeout and while ctx lasts. It returns call's last error.
func (c *Client) persist(ctx context.Context, call func() error) error {
	deadline := time.Now().Add(cleanupTimeout)
	pause := 50 * time.Millisecond
	for {
		err := call()
		if err == nil || !transient(err) || time.Now().Add(pause).After(deadline) {
			return err
		}
		c.relocate()
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		pause = min(2*pause, maxBackoff)
	}
}

// relocate has a Redis Cluster client reload its slot map after a call
// failed to reach its primary: after a failover, go-redis would otherwise
// keep sending the slot's commands to the primary that died.
func (c *Client) relocate() {
	if cluster, ok := c.rdb.(*redis.ClusterClient); ok {
		cluster.ReloadState(c.ctx)
	}
}
