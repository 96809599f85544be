package redisync

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/watchdog"
)

// Client creates locks and semaphores on one Redis deployment. It owns the
// two background goroutines that all of them share: the subscriber (one
// pub/sub connection through which every waiter is woken) and the watchdog
// (which renews every held lease and heartbeats every fair waiter, in
// batches). Both start when first needed; so does a third, with
// WithObserver or WithLogger, that delivers their events. A Client of one
// server (a redis.NewClient) sends its calls on connections of its own
// (see WithConnSetup), in the callers' goroutines; a Client of a Redis
// Cluster or of a failover client sends them on the given client, from
// worker goroutines that wait up to 5 s for the next call (see Close).
//
// A Client is safe for concurrent use. Close it when done.
type Client struct {
	rdb     redis.UniversalClient // the user's client; with lanes, as a roundtrip.Conn
	cluster clusterClient         // rdb, when it is a Redis Cluster's client; nil otherwise
	cfg     config
	id      string        // prefix of every owner id minted by this Client
	seq     atomic.Uint64 // last owner number

	sub     *subscriber
	wd      *watchdog.Watchdog
	rt      *roundtrip.Runner // runs every call to Redis (internal/roundtrip)
	publish string            // the scripts' publish command: PUBLISH, or SPUBLISH when sharded
	obs     Observer          // WithObserver; nil: none
	events  *events           // background events for the observer and the logger; nil: neither

	probe probe // that the server has what the Client needs (see Client.ready)

	ctx   context.Context // ends when the Client is closed
	close context.CancelFunc

	releasing atomic.Bool   // set by the Shutdown that sends the releases
	released  chan struct{} // closed when they are done
}

// New returns a Client that uses rdb, which the Client never closes:
//
//   - a *redis.Client, for one Redis server, or for the primary of a
//     group watched by Sentinel (redis.NewFailoverClient);
//   - a *redis.ClusterClient, for a Redis Cluster;
//   - a type of the user's that embeds one of them (a wrapper that adds
//     tracing, say): redisync uses the embedded client's methods.
//
// Any other client is refused with ErrUnsupportedClient: a *redis.Ring
// among them, because a Ring moves a key to another shard when a shard
// goes down or comes back, and a lock whose state moves can have two
// holders; use a Redis Cluster, or a RedMutex over independent servers,
// instead. The options become the defaults of every primitive created by
// the Client. New does no I/O. It returns ErrNilClient for a nil rdb, and
// an error wrapping ErrInvalidOption for an invalid option.
//
// On a Redis Cluster, waiters are woken through sharded pub/sub (SPUBLISH
// and SSUBSCRIBE, Redis 7 and later): each primary delivers the messages
// of its own slots, on one connection per primary that serves a lock with
// waiters. WithPlainPubSub turns it off for older clusters; on a cluster
// without sharded pub/sub, the first call fails with ErrUnsupportedServer,
// which says so.
func New(rdb redis.UniversalClient, opts ...Option) (*Client, error) {
	if isNil(rdb) {
		return nil, ErrNilClient
	}
	cluster, err := classify(rdb)
	if err != nil {
		return nil, err
	}
	cfg := with(defaultConfig(), atClient, opts)
	if cfg.err != nil {
		return nil, cfg.err
	}
	return clientWith(rdb, cluster, cfg, true), nil
}

// isNil reports whether rdb is nil, or a nil pointer in an interface.
func isNil(rdb redis.UniversalClient) bool {
	v := reflect.ValueOf(rdb)
	return rdb == nil || (v.Kind() == reflect.Pointer && v.IsNil())
}

// clusterClient is what redisync uses of a *redis.ClusterClient, or of a
// type that embeds one.
type clusterClient interface {
	redis.UniversalClient
	Options() *redis.ClusterOptions
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
	ForEachShard(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
	ReloadState(ctx context.Context)
}

// nodeClient is what redisync uses of a *redis.Client, or of a type that
// embeds one: a connection of its own for WithReplicas.
type nodeClient interface {
	redis.UniversalClient
	Options() *redis.Options
	Conn() *redis.Conn
}

// classify tells a Redis Cluster's client (returned) from one server's
// (nil), and refuses any other client, and a wrapper of a nil one.
func classify(rdb redis.UniversalClient) (clusterClient, error) {
	switch rdb := rdb.(type) {
	case clusterClient:
		if !hasOptions(func() bool { return rdb.Options() != nil }) {
			return nil, fmt.Errorf("%w: %T wraps a nil *redis.ClusterClient", ErrNilClient, rdb)
		}
		return rdb, nil
	case nodeClient:
		if !hasOptions(func() bool { return rdb.Options() != nil }) {
			return nil, fmt.Errorf("%w: %T wraps a nil *redis.Client", ErrNilClient, rdb)
		}
		return nil, nil
	case interface{ Options() *redis.RingOptions }:
		return nil, fmt.Errorf("%w: a *redis.Ring moves a lock's keys to another shard when a shard goes down or comes back, "+
			"which can let two holders in; use a *redis.ClusterClient, or a RedMutex over independent servers", ErrUnsupportedClient)
	}
	return nil, fmt.Errorf("%w: %T is neither a *redis.Client nor a *redis.ClusterClient, and embeds neither", ErrUnsupportedClient, rdb)
}

// hasOptions reports whether options reports a client's options, rather
// than panicking on a nil client that a wrapper embeds.
func hasOptions(options func() bool) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return options()
}

// clientWith returns a Client of rdb (cluster: rdb, when it is a Redis
// Cluster's client) with the defaults cfg, which sends its calls on
// connections of its own (ownConns) where rdb allows it.
func clientWith(rdb redis.UniversalClient, cluster clusterClient, cfg config, ownConns bool) *Client {
	c := &Client{
		rdb:      rdb,
		cluster:  cluster,
		cfg:      cfg,
		id:       uuid.NewString(),
		publish:  "PUBLISH",
		released: make(chan struct{}),
	}
	c.ctx, c.close = context.WithCancel(context.Background())
	sharded := cluster
	if cluster != nil && !c.cfg.plain {
		c.publish = "SPUBLISH"
	} else {
		sharded = nil
	}
	c.obs = c.cfg.obs
	c.events = newEvents(c.cfg.obs, c.cfg.log)
	c.sub = newSubscriber(rdb, sharded, c.ctx, c.events, c.passOn)
	wcfg := watchdog.Config{
		Renew: func(ctx context.Context, batch []watchdog.Renewal) ([]int64, error) {
			return c.rt.Send(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
				return renewCall(batch).run(ctx, rdb).Int64Slice()
			})
		},
		Sharded: cluster != nil,
	}
	if cluster != nil {
		wcfg.Reload = func() { cluster.ReloadState(c.ctx) }
	}
	var lanes *roundtrip.Lanes
	if node, ok := rdb.(nodeClient); ok && ownConns && cluster == nil && node.Options().Addr != failoverAddr {
		lanes = roundtrip.NewLanes(node.Options(), cfg.connSetup)
		if rc, ok := rdb.(*redis.Client); ok {
			c.rdb = lanes.Conn(rc) // the calls it sends on rdb, as FCALL where the lanes' are
		}
	}
	c.rt = roundtrip.New(c.ctx, ErrClosed, wcfg.Reload, c.rdb, lanes)
	if c.events != nil {
		wcfg.Events = c.events
	}
	c.wd = watchdog.New(c.ctx, wcfg)
	return c
}

// failoverAddr is the address in the options of go-redis's failover client
// (redis.NewFailoverClient), whose connections go-redis moves to the new
// primary when Sentinel fails over. Connections of the Client's own would
// stay on the old primary until it is demoted: such a Client sends its
// calls on the failover client, as a Redis Cluster's does.
const failoverAddr = "FailoverClient"

// Shutdown closes the Client, as Close does, within ctx: it stops the
// subscriber and the watchdog; waiting calls return ErrClosed, and later
// calls fail with ErrClosed. Every hold is lost (its Lost channel is
// closed) and then released in Redis, as etcd's Session.Close revokes its
// lease, so that other processes need not wait for the leases to run out;
// the releases are sent all at once. Shutdown then waits for the calls
// that take something (Lock, TryLock, Acquire, TryAcquire, Accept, a
// MultiMutex's Lock and TryLock, and those built on them) to end, each
// having withdrawn from its queue or given back what it took, however
// late its goroutine runs, and none of them takes anything once Shutdown
// has begun; for the calls to Redis still running in the background (the
// clean-up of calls whose context ended); and for the observer and the
// logger to be told the events queued for them. It closes the Client's
// own connections and ends its worker goroutines.
//
// Shutdown returns nil when every hold was released and all of that was
// done. Otherwise it returns what it could not do, joined (errors.Join):
// for each hold whose release failed or was not confirmed before ctx
// ended, an *OpError with Op "close" and the hold's name, wrapping
// ErrUnconfirmed and the cause (the hold runs out in Redis within its
// lease); and ctx's error when ctx ended before the calls did (they end by
// themselves, each clean-up bounded by 5 s, and their goroutines then
// exit). A second Shutdown (or Close) waits for what is left, and returns
// nil unless ctx ends first.
//
// As http.Server.Shutdown, it is meant for a signal handler with a
// deadline:
//
//	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
//	defer cancel()
//	if err := client.Shutdown(ctx); err != nil {
//		log.Printf("redisync: %v", err) // holds not released run out within their lease
//	}
func (c *Client) Shutdown(ctx context.Context) error { return c.shutdown(ctx, 0) }

// closeTimeout bounds the releases that Close sends, and its wait for the
// observer and the logger.
const closeTimeout = 2 * time.Second

// Close is Shutdown with fixed bounds: it waits at most 2 s for the
// releases, as long as it takes for the calls to end (their clean-ups are
// bounded by 5 s each: they reach Redis before Close returns, never
// after), and at most 2 s more for the observer and the logger (an
// observer or a log handler that blocks does not hold Close longer; what
// it has not taken by then is not delivered). It returns the releases
// that failed, as Shutdown does. A Client not closed keeps its idle
// workers for up to 5 s after their last call.
func (c *Client) Close() error { return c.shutdown(context.Background(), closeTimeout) }

// shutdown is Shutdown within ctx; bound, when not 0, bounds each of its
// waits for the releases and for the observer.
func (c *Client) shutdown(ctx context.Context, bound time.Duration) error {
	phase := func() (context.Context, context.CancelFunc) {
		if bound == 0 {
			return context.WithCancel(ctx)
		}
		return context.WithTimeout(ctx, bound)
	}
	c.close()
	c.sub.wait()
	if !c.releasing.CompareAndSwap(false, true) {
		// Another Shutdown sends the releases: wait for them.
		select {
		case <-c.released:
		case <-ctx.Done():
			return ctx.Err()
		}
		return c.rt.Close(ctx)
	}
	held := c.wd.Wait()
	rctx, cancel := phase()
	errs := make([]error, len(held), len(held)+1)
	var wg sync.WaitGroup
	for i, release := range held {
		wg.Go(func() { errs[i] = release(rctx) })
	}
	wg.Wait()
	cancel()
	close(c.released)
	errs = append(errs, c.rt.Close(ctx))
	dctx, cancel := phase()
	defer cancel()
	c.events.close(dctx)
	return errors.Join(errs...)
}

// usable reports why the Client cannot be used, if it cannot.
func (c *Client) usable() error {
	if err := c.made(); err != nil {
		return err
	}
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// made reports the use of a primitive's zero value, which has no Client.
func (c *Client) made() error {
	if c == nil {
		return errZeroValue
	}
	return nil
}

// observer returns the Client's Observer, or nil: none is told the
// calls of a primitive's zero value, which has no Client.
func (c *Client) observer() Observer {
	if c == nil {
		return nil
	}
	return c.obs
}

// enter counts in a call that takes something (a Lock, an Acquire, a
// TryLock), unless the Client is closed; leave counts it out when it ends.
// Close returns only once every call counted in has ended: a call that was
// waiting when Close came withdraws from its queue, and one that took
// something gives it back, before Close returns, never after it, even when
// its goroutine runs late.
//
// The first calls of a Client also check that the server has what the
// Client needs (see ready), on channel, the caller's grant channel.
func (c *Client) enter(ctx context.Context, channel string) (leave func(), err error) {
	if !c.rt.Enter() {
		return nil, ErrClosed
	}
	err = c.usable()
	if err == nil {
		err = c.ready(ctx, channel)
	}
	if err != nil {
		c.rt.Leave()
		return nil, err
	}
	return c.rt.Leave, nil
}

// ticket mints an id unique to this Client value, that starts with label
// (see WithLabel): a semaphore holding's or a Lock call's ticket,
// "label/client-n.random". A grant is addressed to a ticket (or to a
// semaphore waiter id made from it): its random part, from crypto/rand,
// makes the address of a waiting call known only to Redis and to this
// Client until the grant is published, so that a grant forged by another
// publisher on the grant channel names no waiting call (see
// docs/design.md, Tickets). The scripts and internal/schema find the
// Client id before the last '-', which the hex random part never holds.
func (c *Client) ticket(label string) string {
	var b [MaxLabelLen + 128]byte
	s := append(b[:0], label...)
	s = append(s, '/')
	s = append(s, c.id...)
	s = append(s, '-')
	s = strconv.AppendUint(s, c.seq.Add(1), 10)
	return string(appendRandom(s))
}

// randomBytes is the size of the random part of a ticket or a waiter id:
// 96 bits.
const randomBytes = 12

// appendRandomDigits appends to b 96 bits from crypto/rand as 30 decimal
// digits (20 and 10, zero-padded).
func appendRandomDigits(b []byte) []byte {
	var r [randomBytes]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand.Read)
	hi, lo := binary.LittleEndian.Uint64(r[:8]), binary.LittleEndian.Uint32(r[8:])
	return fmt.Appendf(b, "%020d%010d", hi, lo)
}

// appendRandom appends to b '.' and randomBytes from crypto/rand, in
// lowercase hex.
func appendRandom(b []byte) []byte {
	var r [randomBytes]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand.Read)
	return hex.AppendEncode(append(b, '.'), r[:])
}
