package redisync

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
)

// Timing of the subscriber.
const (
	// lingerFor is how long a channel stays subscribed after its last
	// waiter left, so that a lock under steady contention does not pay a
	// SUBSCRIBE and an UNSUBSCRIBE for every wait.
	lingerFor = 2 * time.Second
	// pingAfter is how long the connection may be silent before it is
	// pinged, and pongWait how long the ping may go unanswered before
	// the connection is taken for dead and replaced.
	pingAfter = 3 * time.Second
	pongWait  = 2 * time.Second
	// maxBackoff caps the pause between failed reads while Redis is down.
	maxBackoff = time.Second
	// joinWait is the longest a new waiter waits for its channel's
	// subscription to be confirmed before it looks at the lock anyway.
	joinWait = 500 * time.Millisecond
)

// subscriber multiplexes every waiter of a Client over as few pub/sub
// connections as the deployment allows: one in all, or, with sharded
// pub/sub on a Redis Cluster, one per primary that serves a channel with
// waiters. Each connection (a shard) is read by a goroutine of its own.
// Channels are reference counted by their waiters: the first waiter of a
// channel has it subscribed, and it is unsubscribed a little after the
// last one leaves. Subscription changes are decided and written under one
// mutex, so they reach Redis in the order they were decided.
//
// Which waiters wait on which channel, and how they are woken, is the
// registry's (reg): the subscriber tells it what Redis said. A channel is
// confirmed when Redis says it subscribed it and no unsubscription of it
// is still to be answered on that connection (Redis answers in order, so a
// confirmation then means the channel is subscribed from that point on).
// Messages may be lost while a connection is down, so every waiter of a
// channel is woken to look for itself when the channel is subscribed
// again: by go-redis after a reconnect, or, for sharded pub/sub, by the
// subscriber itself, which replaces a failed shard's connection and asks
// the cluster again which primary serves each of its channels (slots move
// on failover and resharding).
type subscriber struct {
	rdb     redis.UniversalClient
	cluster clusterClient   // set when channels are sharded (SSUBSCRIBE)
	ctx     context.Context // ends when the Client is closed
	closed  <-chan struct{} // ctx.Done()
	ev      *events         // reconnections are told here; may be nil
	wg      sync.WaitGroup
	wmu     sync.Mutex // held while subscription changes are decided and written

	reg *waiters.Registry // the waiters of every channel

	mu       sync.Mutex        // guards the fields below and every shard; taken before reg's
	shards   map[string]*shard // by primary address; "" for the one plain connection
	on       map[string]*shard // the connection each channel is subscribed on
	failures int               // consecutive shard failures, for the back-off
	down     bool              // a failure was told and no subscription confirmed since
}

// shard is one pub/sub connection and the goroutine that reads it.
type shard struct {
	addr     string
	ps       *redis.PubSub
	channels int            // channels subscribed through it
	unsubs   map[string]int // unsubscriptions not answered yet, by channel
	dead     bool           // closed: failed, or no channel left
}

// newSubscriber returns the subscriber of a Client. With cluster set,
// channels are sharded: subscribed with SSUBSCRIBE on the primary that
// serves their slot. unheard is told each wake-up of plain waiters that
// none took (see registry).
func newSubscriber(rdb redis.UniversalClient, cluster clusterClient, ctx context.Context, ev *events, unheard func(channel string)) *subscriber {
	return &subscriber{
		rdb:     rdb,
		cluster: cluster,
		ctx:     ctx,
		closed:  ctx.Done(),
		ev:      ev,
		reg:     waiters.New(unheard, ErrClosed),
		shards:  make(map[string]*shard),
		on:      make(map[string]*shard),
	}
}

// add registers a new member of set for ticket on the named channel, and
// has the channel subscribed if it is not. It returns a channel closed
// once the subscription is confirmed, or ErrClosed after Close.
func (s *subscriber) add(set *waiters.Set, name, ticket string, plain bool) (<-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, ErrClosed
	}
	ready, ok := s.reg.Add(set, name, ticket, plain)
	if !ok {
		return nil, ErrClosed
	}
	if s.on[name] == nil {
		// Subscribing may dial a connection or ask a cluster for its
		// slots: it must not hold the caller past its ctx.
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.sync()
		}()
	}
	return ready, nil
}

// confirmed records a subscribe confirmation for a channel on sh. One
// that answers a subscription since unsubscribed is stale and ignored.
func (s *subscriber) confirmed(sh *shard, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh.unsubs[name] > 0 || s.on[name] != sh {
		return
	}
	s.failures, s.down = 0, false
	s.reg.Confirm(name)
}

// unsubscribed records an unsubscribe reply for a channel on sh. It
// reports false when the server dropped a channel that sh still serves
// (its slot moved to another primary): the shard must be replaced.
func (s *subscriber) unsubscribed(sh *shard, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh.unsubs[name] > 0 {
		if sh.unsubs[name]--; sh.unsubs[name] == 0 {
			delete(sh.unsubs, name)
		}
		return true
	}
	return s.on[name] != sh
}

// lapsed records that sh's connection failed with err: go-redis dials
// again and subscribes its channels anew, so replies still due on the old
// connection will never come, and until the new confirmations arrive the
// channels' waiters cannot rely on messages.
func (s *subscriber) lapsed(sh *shard, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed(err)
	clear(sh.unsubs)
	for name, on := range s.on {
		if on == sh {
			s.reg.Lapse(name)
		}
	}
}

// failed tells the events queue that a connection failed with err, unless
// a failure was told already and no subscription was confirmed since (one
// event per outage, however many retries it takes). s.mu must be held.
func (s *subscriber) failed(err error) {
	if !s.down && s.ctx.Err() == nil {
		s.down = true
		s.ev.emit(Event{Kind: EventReconnect, Err: err})
	}
}

// run reads what Redis sends on a shard's connection and dispatches it,
// until the Client is closed or the shard closed. For plain pub/sub,
// go-redis reconnects and subscribes again by itself when a read fails;
// a sharded connection is replaced instead (see fail). run pings a silent
// connection so that a dead one fails, and unsubscribes idle channels
// when they are due.
func (s *subscriber) run(sh *shard) {
	defer s.wg.Done()
	defer sh.ps.Close()
	backoff := time.Duration(0)
	heard := time.Now()  // when something last arrived
	var pinged time.Time // when a ping still unanswered was sent
	for s.ctx.Err() == nil && !s.isDead(sh) {
		msg, err := sh.ps.ReceiveTimeout(s.ctx, time.Second)
		switch {
		case s.ctx.Err() != nil || s.isDead(sh):
			return
		case err == nil:
			backoff, heard, pinged = 0, time.Now(), time.Time{}
			if !s.dispatch(sh, msg) {
				s.fail(sh, errSlotMoved)
				return
			}
		case isTimeout(err) && !pinged.IsZero() && time.Since(pinged) >= pongWait:
			// Silent and deaf to a ping: a connection that died
			// without a reset (a partition) is replaced, or every
			// message on it would be lost until TCP gives up.
			s.fail(sh, errNoPong)
			return
		case isTimeout(err):
			if pinged.IsZero() && time.Since(heard) >= pingAfter {
				pinged = time.Now()
				_ = sh.ps.Ping(s.ctx) // a failed write makes go-redis reconnect
			}
		case s.cluster != nil:
			s.fail(sh, err)
			return
		default:
			// The connection failed; go-redis redials on the next read.
			s.lapsed(sh, err)
			backoff = min(max(2*backoff, 10*time.Millisecond), maxBackoff)
			s.pause(backoff)
		}
		if s.sweepDue(time.Now()) {
			s.sync()
		}
	}
}

// dispatch handles one thing received on sh. It reports false when the
// shard must be replaced: the server dropped one of its channels (its
// slot moved to another primary).
func (s *subscriber) dispatch(sh *shard, msg any) bool {
	switch m := msg.(type) {
	case *redis.Message:
		s.reg.Deliver(m.Channel, m.Payload)
	case *redis.Subscription:
		switch m.Kind {
		case "subscribe", "ssubscribe":
			s.confirmed(sh, m.Channel)
		case "unsubscribe", "sunsubscribe":
			return s.unsubscribed(sh, m.Channel) || s.cluster == nil
		}
	}
	return true
}

// Why a connection is replaced although reading it did not fail.
var (
	errSlotMoved = errors.New("redisync: the server dropped a channel whose slot moved")
	errNoPong    = errors.New("redisync: no reply to a ping")
)

// isDead reports whether sh was closed.
func (s *subscriber) isDead(sh *shard) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sh.dead
}

// fail replaces a connection that failed with err (a sharded one that
// failed in any way, a plain one that stopped answering pings): its
// channels are marked
// unsubscribed (their waiters will all look again once they are
// subscribed anew), the cluster's slot map is reloaded, and, after a
// back-off that grows while failures repeat, the channels that still have
// waiters are subscribed again wherever their slots are served now.
func (s *subscriber) fail(sh *shard, err error) {
	s.mu.Lock()
	s.failed(err)
	sh.dead = true
	if s.shards[sh.addr] == sh {
		delete(s.shards, sh.addr)
	}
	for name, on := range s.on {
		if on == sh {
			delete(s.on, name)
			s.reg.Lapse(name)
		}
	}
	s.failures++
	backoff := min(time.Duration(1<<min(s.failures, 10))*5*time.Millisecond, maxBackoff)
	s.mu.Unlock()
	_ = sh.ps.Close()
	if s.cluster != nil {
		s.cluster.ReloadState(s.ctx) // the primaries may have changed
	}
	s.pause(backoff)
	s.sync()
}

// pause sleeps for d or until the Client is closed.
func (s *subscriber) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.closed:
	}
}

// sweepDue reports whether an idle channel is due to be unsubscribed.
func (s *subscriber) sweepDue(now time.Time) bool {
	idle := s.reg.IdleSince()
	return !idle.IsZero() && !now.Before(idle.Add(lingerFor))
}

// sync subscribes channels that have waiters and are not subscribed, and
// unsubscribes those idle for lingerFor.
func (s *subscriber) sync() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	now := time.Now()
	var want []string
	unsub := make(map[*shard][]string)
	s.mu.Lock()
	for _, name := range s.reg.Sweep(func(name string, idleSince time.Time) bool {
		sh := s.on[name]
		if sh == nil {
			return true
		}
		if now.Sub(idleSince) < lingerFor {
			return false
		}
		unsub[sh] = append(unsub[sh], name)
		sh.channels--
		sh.unsubs[name]++
		delete(s.on, name)
		return true
	}) {
		if s.on[name] == nil {
			want = append(want, name)
		}
	}
	s.mu.Unlock()

	addrs := s.primaries(want)

	sub := make(map[*shard][]string)
	var empty []*shard
	s.mu.Lock()
	for _, name := range want {
		if s.on[name] != nil || !s.reg.HasWaiters(name) || s.ctx.Err() != nil {
			continue
		}
		sh := s.shardFor(addrs[name])
		sh.channels++
		s.on[name] = sh
		sub[sh] = append(sub[sh], name)
	}
	for addr, sh := range s.shards {
		if sh.channels == 0 {
			sh.dead = true
			delete(s.shards, addr)
			empty = append(empty, sh)
		}
	}
	s.mu.Unlock()

	// A write that fails made go-redis replace the connection inside the
	// call, subscribing on the new one the channels it knew before it: not
	// those of this write, and no read need fail afterwards. So the shard
	// is replaced, as after a failed read: its channels are subscribed
	// anew, and their waiters look again once they are.
	failed := make(map[*shard]error)
	for sh, names := range unsub {
		if err := s.write(sh, false, names); err != nil {
			failed[sh] = err
		}
	}
	for sh, names := range sub {
		if err := s.write(sh, true, names); err != nil {
			failed[sh] = err
		}
	}
	for _, sh := range empty {
		_ = sh.ps.Close()
	}
	for sh, err := range failed {
		if s.ctx.Err() != nil || s.isDead(sh) {
			continue
		}
		s.wg.Add(1) // sync runs in a goroutine that s.wg counts
		go func() {
			defer s.wg.Done()
			s.fail(sh, err)
		}()
	}
}

// primaries returns the address of the primary serving each named
// channel's slot: "" for all of them unless channels are sharded. A
// channel whose primary is unknown (the cluster is unreachable) maps to ""
// too; its subscription fails, and is tried again after a back-off.
func (s *subscriber) primaries(names []string) map[string]string {
	addrs := make(map[string]string, len(names))
	if s.cluster == nil {
		return addrs
	}
	for _, name := range names {
		if node, err := s.cluster.MasterForKey(s.ctx, name); err == nil {
			addrs[name] = node.Options().Addr
		}
	}
	return addrs
}

// shardFor returns the shard of the primary at addr, opening it if needed.
// s.mu must be held.
func (s *subscriber) shardFor(addr string) *shard {
	if sh := s.shards[addr]; sh != nil {
		return sh
	}
	sh := &shard{addr: addr, unsubs: make(map[string]int)}
	if s.cluster != nil {
		sh.ps = s.cluster.SSubscribe(s.ctx)
	} else {
		sh.ps = s.rdb.Subscribe(s.ctx)
	}
	s.shards[addr] = sh
	s.wg.Add(1)
	go s.run(sh)
	return sh
}

// write subscribes (or unsubscribes) the named channels on sh, and
// returns the first error. Sharded channels go one slot per command:
// Redis refuses a command whose channels hash to different slots.
func (s *subscriber) write(sh *shard, subscribe bool, names []string) error {
	if s.cluster == nil {
		if subscribe {
			return sh.ps.Subscribe(s.ctx, names...)
		}
		return sh.ps.Unsubscribe(s.ctx, names...)
	}
	bySlot := make(map[uint16][]string)
	for _, name := range names {
		bySlot[schema.Slot(name)] = append(bySlot[schema.Slot(name)], name)
	}
	var first error
	for _, group := range bySlot {
		var err error
		if subscribe {
			err = sh.ps.SSubscribe(s.ctx, group...)
		} else {
			err = sh.ps.SUnsubscribe(s.ctx, group...)
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// wait wakes every waiter, which then returns ErrClosed, closes every
// connection after the Client was closed, and waits for the goroutines
// that read them to exit.
func (s *subscriber) wait() {
	s.reg.Close()
	s.mu.Lock()
	shards := make([]*shard, 0, len(s.shards))
	for _, sh := range s.shards {
		shards = append(shards, sh)
	}
	s.mu.Unlock()
	for _, sh := range shards {
		_ = sh.ps.Close() // unblocks run's read
	}
	s.wg.Wait()
}

// listen registers l on the named channel, has the channel subscribed if
// it is not, and runs run in a goroutine that Close waits for; l is
// unregistered when run returns. It returns ErrClosed after Close.
func (s *subscriber) listen(name string, l *waiters.Listener, run func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil || !s.reg.Listen(name, l) {
		return ErrClosed
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.reg.Unlisten(name, l)
		run()
	}()
	if s.on[name] == nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.sync()
		}()
	}
	return nil
}

// isTimeout reports whether err is a read timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
