package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timing of a Redlock.
const (
	// defaultNodeTimeout caps the default per-node timeout (a tenth of
	// the lease).
	defaultNodeTimeout = 500 * time.Millisecond
	// maxSplitJitter caps the random pause after a round in which
	// contenders split the nodes between them and nobody won.
	maxSplitJitter = 50 * time.Millisecond
	// minGrace is the least time the slower nodes of a round are given
	// once its outcome is known, for scheduling noise.
	minGrace = 5 * time.Millisecond
)

// Redlock takes locks on N independent Redis deployments ("nodes") at
// once, after the Redlock algorithm: a lock is held when a majority of the
// nodes (the quorum, N/2+1) granted it within the lease. It keeps working
// while fewer than N - quorum + 1 nodes are down, slow or wiped. See
// docs/deployment.md for what this buys and what it does not.
//
// A Redlock owns one Client per node (a subscriber and a watchdog each),
// created with the options given to NewRedlock. It is safe for concurrent
// use. Close it when done.
type Redlock struct {
	clients []*Client
	quorum  int
	cfg     config

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup // calls to nodes still running, possibly abandoned
}

// NewRedlock returns a Redlock over the nodes rdbs, each a client of an
// independent Redis deployment (the Redlock never closes them). The options
// become the defaults of every lock of the Redlock (a RedMutex always
// barges: it does not queue its waiters, see RedMutex).
// NewRedlock does no I/O. It returns an error for bad input: no nodes
// (ErrNoNodes), a nil one (ErrNilClient), the same node twice
// (ErrDuplicateNode: the same client value, or two *redis.Client with the
// same address and database), a client that New refuses
// (ErrUnsupportedClient), an invalid option (ErrInvalidOption).
//
// An even number of nodes is accepted, but tolerates no more failures than
// one node fewer: 4 nodes need 3, like 5; 2 nodes need both.
func NewRedlock(rdbs []redis.UniversalClient, opts ...Option) (*Redlock, error) {
	r := &Redlock{cfg: with(defaultConfig(), atRedlock, opts), quorum: len(rdbs)/2 + 1}
	if err := cmp.Or(checkNodes(rdbs), r.cfg.err); err != nil {
		return nil, err
	}
	for _, rdb := range rdbs {
		cluster, _ := classify(rdb) // checked by checkNodes
		// A round calls every node from a goroutine of its own: a node's
		// Client sends on the node's client, from its workers, without
		// connections of its own.
		r.clients = append(r.clients, clientWith(rdb, cluster, r.cfg, false))
	}
	return r, nil
}

// Shutdown shuts the Redlock's Clients down within ctx (see
// Client.Shutdown: every hold is lost, its Lost channel closed, and
// released on its node), and waits for the calls to nodes still running,
// including those a lock gave up waiting for, to return. It returns what
// the nodes could not release, as Client.Shutdown does, each error in a
// *NodeError that names its node, and ctx's error when ctx ended first.
func (r *Redlock) Shutdown(ctx context.Context) error {
	return r.shutdown(ctx, func(c *Client) error { return c.Shutdown(ctx) })
}

// Close is Shutdown with Client.Close's bounds.
func (r *Redlock) Close() error {
	return r.shutdown(context.Background(), (*Client).Close)
}

// shutdown closes each node's Client with closeNode, then waits for the calls
// to nodes, until ctx ends.
func (r *Redlock) shutdown(ctx context.Context, closeNode func(*Client) error) error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	// The first node's Client tells the RedMutexes' events: it is closed
	// last, so that a hold that closing the others ends is told before
	// its queue stops.
	var errs []error
	for i := len(r.clients) - 1; i >= 0; i-- {
		if err := closeNode(r.clients[i]); err != nil {
			errs = append(errs, &NodeError{Node: i, Err: err})
		}
	}
	done := make(chan struct{})
	go func() {
		r.calls.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// Quorum returns how many nodes must grant a lock: a majority.
func (r *Redlock) Quorum() int { return r.quorum }

// observer returns the Redlock's Observer, or nil: none is told the
// calls of a RedMutex's zero value, which has no Redlock.
func (r *Redlock) observer() Observer {
	if r == nil {
		return nil
	}
	return r.cfg.obs
}

// usable reports why the Redlock cannot be used, if it cannot.
func (r *Redlock) usable() error {
	if r == nil {
		return errZeroValue // a RedMutex's zero value
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	return nil
}

// goCall runs f in a goroutine that Close waits for, unless the Redlock is
// closed.
func (r *Redlock) goCall(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.calls.Add(1)
	go func() {
		defer r.calls.Done()
		f()
	}()
	return true
}

// checkNodes validates NewRedlock's nodes.
func checkNodes(rdbs []redis.UniversalClient) error {
	if len(rdbs) == 0 {
		return ErrNoNodes
	}
	seen := make(map[any]int)
	for i, rdb := range rdbs {
		if isNil(rdb) {
			return fmt.Errorf("%w: redlock node %d", ErrNilClient, i)
		}
		cluster, err := classify(rdb)
		if err != nil {
			return fmt.Errorf("redlock node %d: %w", i, err)
		}
		key := nodeKey(rdb, cluster)
		if j, ok := seen[key]; ok {
			return fmt.Errorf("%w: nodes %d and %d are the same", ErrDuplicateNode, j, i)
		}
		seen[key] = i
	}
	return nil
}

// nodeKey returns what tells one Redlock node from another: a server's
// network, address and database; the options of a client whose address is
// not its server's (a primary found through Sentinel), or of a cluster's,
// which a wrapper shares with the client it wraps.
func nodeKey(rdb redis.UniversalClient, cluster clusterClient) any {
	if cluster != nil {
		return cluster.Options()
	}
	o := rdb.(nodeClient).Options()
	if o.Addr == "FailoverClient" { // go-redis's for redis.NewFailoverClient
		return o
	}
	return fmt.Sprintf("%s|%s|%d", o.Network, o.Addr, o.DB)
}

// WithNodeTimeout sets how long a Redlock waits for one node's reply before
// it counts the node as failed for this round (the call goes on in the
// background, and whatever it did is undone when it returns). It should be
// small next to the lease: the time a round takes is taken off the lock's
// validity. d must be in [1ms, MaxLease]. It applies to NewRedlock, as
// the default, and to a RedMutex.
//
// The default is a tenth of the lease, at most 500 ms.
func WithNodeTimeout(d time.Duration) Option {
	return option("WithNodeTimeout", atRedMutex, func(cfg *config) {
		if cfg.checkDuration("node timeout", d) {
			cfg.node = d
		}
	})
}
