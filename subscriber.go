package redisync

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
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
	// deafPoll is the longest a waiter sleeps while its channel is not
	// subscribed (a subscription not confirmed yet, a connection being
	// re-established): messages cannot reach it then.
	deafPoll = 250 * time.Millisecond
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
// A channel is confirmed when Redis says it subscribed it and no
// unsubscription of it is still to be answered on that connection (Redis
// answers in order, so a confirmation then means the channel is subscribed
// from that point on). Until then its waiters cannot rely on messages:
// they sleep at most deafPoll.
//
// A message wakes waiters by closing their signal channel: an empty
// message wakes the first waiter of the channel that has no signal pending
// (one per process, in arrival order); a message "ticket:token ..." wakes
// the waiters of those tickets and hands them the grant. Messages may be
// lost while a connection is down, so every waiter of a channel is woken to
// look for itself when the channel is subscribed again: by go-redis after a
// reconnect, or, for sharded pub/sub, by the subscriber itself, which
// replaces a failed shard's connection and asks the cluster again which
// primary serves each of its channels (slots move on failover and
// resharding).
type subscriber struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // set when channels are sharded (SSUBSCRIBE)
	ctx     context.Context      // ends when the Client is closed
	closed  <-chan struct{}      // ctx.Done()
	ev      *events              // reconnections are told here; may be nil
	wg      sync.WaitGroup
	wmu     sync.Mutex // held while subscription changes are decided and written

	mu        sync.Mutex        // guards the fields below and every shard, channel and waiter
	shards    map[string]*shard // by primary address; "" for the one plain connection
	channels  map[string]*channel
	nextSweep time.Time // when an idle channel is next due to be unsubscribed
	failures  int       // consecutive shard failures, for the back-off
	down      bool      // a failure was told and no subscription confirmed since
}

// shard is one pub/sub connection and the goroutine that reads it.
type shard struct {
	addr     string
	ps       *redis.PubSub
	channels int            // channels subscribed through it
	unsubs   map[string]int // unsubscriptions not answered yet, by channel
	dead     bool           // closed: failed, or no channel left
}

// channel is the local state of one pub/sub channel.
type channel struct {
	name      string
	waiters   []*waiter     // in arrival order
	shard     *shard        // the connection it is subscribed on; nil when not
	ready     chan struct{} // closed once the subscription is confirmed
	confirmed bool
	missed    bool      // waiters looked while it was not confirmed: wake them all when it is
	idleSince time.Time // when the last waiter left
}

// waiter is one blocked call registered on a channel.
type waiter struct {
	s      *subscriber
	ch     *channel
	ticket string        // the call's address in grant messages
	signal chan struct{} // closed when signalled; replaced once consumed
	fired  bool          // signal closed and not consumed yet
	grant  string        // "ticket:token" received with the signal, if any
}

// newSubscriber returns the subscriber of a Client. With cluster set,
// channels are sharded: subscribed with SSUBSCRIBE on the primary that
// serves their slot.
func newSubscriber(rdb redis.UniversalClient, cluster *redis.ClusterClient, ctx context.Context, ev *events) *subscriber {
	return &subscriber{
		rdb:      rdb,
		cluster:  cluster,
		ctx:      ctx,
		closed:   ctx.Done(),
		ev:       ev,
		shards:   make(map[string]*shard),
		channels: make(map[string]*channel),
	}
}

// join registers a waiter for the ticket on the named channel and waits
// until the subscription is confirmed by Redis, so that the caller's next
// look at the lock cannot miss a message. The wait is bounded by joinWait
// (after which the caller proceeds anyway: it sleeps at most deafPoll
// until the channel is confirmed, and is woken when it is), ctx and Close.
// The caller must call leave.
func (s *subscriber) join(ctx context.Context, name, ticket string) (*waiter, error) {
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	ch := s.channels[name]
	if ch == nil {
		ch = &channel{name: name, ready: make(chan struct{})}
		s.channels[name] = ch
	}
	w := s.add(ch, ticket)
	ready := ch.ready
	if ch.shard == nil {
		// Subscribing may dial a connection or ask a cluster for its
		// slots: it must not hold the caller past its ctx.
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.sync()
		}()
	}
	s.mu.Unlock()

	t := time.NewTimer(joinWait)
	defer t.Stop()
	select {
	case <-ready:
		return w, nil
	case <-t.C:
		s.mu.Lock()
		w.ch.missed = w.ch.missed || !w.ch.confirmed
		s.mu.Unlock()
		return w, nil
	case <-ctx.Done():
		w.leave()
		return nil, ctx.Err()
	case <-s.closed:
		w.leave()
		return nil, ErrClosed
	}
}

// joinConfirmed registers a waiter only if the channel's subscription is
// already confirmed, which costs no round trip; otherwise it returns nil.
func (s *subscriber) joinConfirmed(name, ticket string) *waiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.channels[name]
	if ch == nil || !ch.confirmed {
		return nil
	}
	return s.add(ch, ticket)
}

// add appends a new waiter to ch. s.mu must be held.
func (s *subscriber) add(ch *channel, ticket string) *waiter {
	w := &waiter{s: s, ch: ch, ticket: ticket, signal: make(chan struct{})}
	ch.waiters = append(ch.waiters, w)
	return w
}

// wait sleeps until the waiter is signalled, d has passed, changed is
// closed, ctx ends or the Client is closed; while the channel is not
// confirmed, it sleeps at most deafPoll. It reports whether the waiter was
// signalled, with the grant that came with the signal, if any.
func (w *waiter) wait(ctx context.Context, d time.Duration, changed <-chan struct{}) (grant string, signalled bool, err error) {
	w.s.mu.Lock()
	sig := w.signal
	if !w.ch.confirmed {
		d = min(d, deafPoll)
	}
	w.s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-sig:
		case <-t.C:
		case <-changed:
		case <-ctx.Done():
			return "", false, ctx.Err()
		case <-w.s.closed:
			return "", false, ErrClosed
		}
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if !w.fired {
		return "", false, nil
	}
	grant = w.grant
	w.fired, w.grant, w.signal = false, "", make(chan struct{})
	return grant, true, nil
}

// retarget makes ticket the address of w in grant messages.
func (w *waiter) retarget(ticket string) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.ticket = ticket
}

// fire signals w, keeping a grant that came with an earlier signal. s.mu
// must be held.
func (w *waiter) fire(grant string) {
	if grant != "" {
		w.grant = grant
	}
	if !w.fired {
		w.fired = true
		close(w.signal)
	}
}

// nudge signals w to look at the lock again.
func (w *waiter) nudge() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.fire("")
}

// leave unregisters w. A plain signal it did not consume is passed to the
// next waiter, so that leaving never swallows a wake-up meant for the
// process.
func (w *waiter) leave() {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := w.ch
	for i, x := range ch.waiters {
		if x == w {
			ch.waiters = append(ch.waiters[:i], ch.waiters[i+1:]...)
			break
		}
	}
	if w.fired && w.grant == "" {
		ch.wakeOne()
	}
	if len(ch.waiters) == 0 {
		ch.idleSince = time.Now()
		if s.nextSweep.IsZero() {
			s.nextSweep = ch.idleSince.Add(lingerFor)
		}
	}
}

// wakeOne signals the first waiter with no signal pending. s.mu must be
// held.
func (ch *channel) wakeOne() {
	for _, w := range ch.waiters {
		if !w.fired {
			w.fire("")
			return
		}
	}
}

// wakeAll signals every waiter. s.mu must be held.
func (ch *channel) wakeAll() {
	for _, w := range ch.waiters {
		w.fire("")
	}
}

// deliver routes a message to the channel's waiters.
func (s *subscriber) deliver(name, payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.channels[name]
	if ch == nil {
		return
	}
	if payload == "" {
		ch.wakeOne()
		return
	}
	for _, grant := range strings.Fields(payload) {
		i := strings.LastIndexByte(grant, ':')
		if i < 0 {
			continue
		}
		for _, w := range ch.waiters {
			if w.ticket == grant[:i] {
				w.fire(grant)
			}
		}
	}
}

// confirmed records a subscribe confirmation for a channel on sh. One
// that answers a subscription since unsubscribed is stale and ignored.
func (s *subscriber) confirmed(sh *shard, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.channels[name]
	if sh.unsubs[name] > 0 || ch == nil || ch.shard != sh {
		return
	}
	s.failures, s.down = 0, false
	switch {
	case ch.confirmed:
		// Not one we asked for: go-redis subscribed again after a
		// reconnect; messages may have been lost meanwhile.
		ch.wakeAll()
	default:
		ch.confirmed = true
		close(ch.ready)
		if ch.missed {
			ch.missed = false
			ch.wakeAll()
		}
	}
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
	ch := s.channels[name]
	return ch == nil || ch.shard != sh
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
	for _, ch := range s.channels {
		if ch.shard == sh && ch.confirmed {
			ch.confirmed, ch.missed = false, true
			ch.ready = make(chan struct{})
		}
	}
}

// failed tells the events queue that a connection failed with err, unless
// a failure was told already and no subscription was confirmed since (one
// event per outage, however many retries it takes). s.mu must be held.
func (s *subscriber) failed(err error) {
	if !s.down && s.ctx.Err() == nil {
		s.down = true
		s.ev.emit(Event{Kind: KindReconnect, Err: err})
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
		s.deliver(m.Channel, m.Payload)
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
	for _, ch := range s.channels {
		if ch.shard != sh {
			continue
		}
		ch.shard, ch.missed = nil, true
		if ch.confirmed {
			ch.confirmed = false
			ch.ready = make(chan struct{})
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
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.nextSweep.IsZero() && !now.Before(s.nextSweep)
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
	s.nextSweep = time.Time{}
	for name, ch := range s.channels {
		switch {
		case len(ch.waiters) > 0:
			if ch.shard == nil {
				want = append(want, name)
			}
		case ch.shard != nil && now.Sub(ch.idleSince) < lingerFor:
			due := ch.idleSince.Add(lingerFor)
			if s.nextSweep.IsZero() || due.Before(s.nextSweep) {
				s.nextSweep = due
			}
		default:
			if sh := ch.shard; sh != nil {
				unsub[sh] = append(unsub[sh], name)
				sh.channels--
				sh.unsubs[name]++
			}
			delete(s.channels, name)
		}
	}
	s.mu.Unlock()

	addrs := s.primaries(want)

	sub := make(map[*shard][]string)
	var empty []*shard
	s.mu.Lock()
	for _, name := range want {
		ch := s.channels[name]
		if ch == nil || len(ch.waiters) == 0 || ch.shard != nil || s.ctx.Err() != nil {
			continue
		}
		sh := s.shardFor(addrs[name])
		sh.channels++
		ch.shard = sh
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

	// Errors need no handling here: a failed write fails the shard's next
	// read, after which its channels are subscribed again.
	for sh, names := range unsub {
		s.write(sh, false, names)
	}
	for sh, names := range sub {
		s.write(sh, true, names)
	}
	for _, sh := range empty {
		_ = sh.ps.Close()
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

// write subscribes (or unsubscribes) the named channels on sh. Sharded
// channels go one slot per command: Redis refuses a command whose
// channels hash to different slots.
func (s *subscriber) write(sh *shard, subscribe bool, names []string) {
	if s.cluster == nil {
		if subscribe {
			_ = sh.ps.Subscribe(s.ctx, names...)
		} else {
			_ = sh.ps.Unsubscribe(s.ctx, names...)
		}
		return
	}
	bySlot := make(map[uint16][]string)
	for _, name := range names {
		bySlot[schema.Slot(name)] = append(bySlot[schema.Slot(name)], name)
	}
	for _, group := range bySlot {
		if subscribe {
			_ = sh.ps.SSubscribe(s.ctx, group...)
		} else {
			_ = sh.ps.SUnsubscribe(s.ctx, group...)
		}
	}
}

// wait closes every connection after the Client was closed, and waits for
// the goroutines that read them to exit.
func (s *subscriber) wait() {
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

// isTimeout reports whether err is a read timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
