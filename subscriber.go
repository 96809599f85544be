package redisync

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timing of the subscriber.
const (
	// lingerFor is how long a channel stays subscribed after its last
	// waiter left, so that a lock under steady contention does not pay a
	// SUBSCRIBE and an UNSUBSCRIBE for every wait.
	lingerFor = 2 * time.Second
	// pingAfter is how long the connection may be silent before it is
	// pinged, so that a dead connection is noticed and replaced.
	pingAfter = 3 * time.Second
	// maxBackoff caps the pause between failed reads while Redis is down.
	maxBackoff = time.Second
)

// subscriber multiplexes every waiter of a Client over one pub/sub
// connection, read by one goroutine. Channels are reference counted by
// their waiters: the first waiter of a channel has it subscribed, and it
// is unsubscribed a little after the last one leaves. Subscription changes
// are decided and written under one mutex, so they reach Redis in the order
// they were decided.
//
// A message wakes waiters by closing their signal channel: an empty
// message wakes the first waiter of the channel that has no signal pending
// (one per process, in arrival order); a message "owner:token ..." wakes
// the waiters of those owners and hands them the grant. When the
// connection comes back after a failure, go-redis subscribes again and
// every waiter of every channel is woken to check the lock itself, since
// messages may have been lost meanwhile.
type subscriber struct {
	rdb    redis.UniversalClient
	ctx    context.Context // ends when the Client is closed
	closed <-chan struct{} // ctx.Done()
	wg     sync.WaitGroup
	wmu    sync.Mutex // held while subscription changes are decided and written

	mu        sync.Mutex // guards the fields below and every channel and waiter
	ps        *redis.PubSub
	channels  map[string]*channel
	nextSweep time.Time // when an idle channel is next due to be unsubscribed
}

// channel is the local state of one pub/sub channel.
type channel struct {
	name      string
	waiters   []*waiter     // in arrival order
	sent      bool          // SUBSCRIBE written and not undone by UNSUBSCRIBE
	inflight  int           // SUBSCRIBE confirmations still to come
	ready     chan struct{} // closed once the subscription is confirmed
	confirmed bool
	idleSince time.Time // when the last waiter left
}

// waiter is one blocked call registered on a channel.
type waiter struct {
	s      *subscriber
	ch     *channel
	owner  string
	signal chan struct{} // closed when signalled; replaced once consumed
	fired  bool          // signal closed and not consumed yet
	grant  string        // "owner:token" received with the signal, if any
}

func newSubscriber(rdb redis.UniversalClient, ctx context.Context) *subscriber {
	return &subscriber{
		rdb:      rdb,
		ctx:      ctx,
		closed:   ctx.Done(),
		channels: make(map[string]*channel),
	}
}

// join registers a waiter for owner on the named channel and waits until
// the subscription is confirmed by Redis, so that the caller's next look at
// the lock cannot miss a message. The wait is bounded by maxWait (after
// which the caller proceeds anyway: its own sleeps are bounded too), ctx
// and Close. The caller must call leave.
func (s *subscriber) join(ctx context.Context, name, owner string, maxWait time.Duration) (*waiter, error) {
	s.mu.Lock()
	if s.ps == nil {
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		s.ps = s.rdb.Subscribe(s.ctx)
		s.wg.Add(1)
		go s.run(s.ps)
	}
	ch := s.channels[name]
	if ch == nil {
		ch = &channel{name: name, ready: make(chan struct{})}
		s.channels[name] = ch
	}
	w := s.add(ch, owner)
	ready := ch.ready
	needSync := !ch.sent
	s.mu.Unlock()
	if needSync {
		s.sync()
	}

	t := time.NewTimer(maxWait)
	defer t.Stop()
	select {
	case <-ready:
		return w, nil
	case <-t.C:
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
func (s *subscriber) joinConfirmed(name, owner string) *waiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.channels[name]
	if ch == nil || !ch.confirmed {
		return nil
	}
	return s.add(ch, owner)
}

// add appends a new waiter to ch. s.mu must be held.
func (s *subscriber) add(ch *channel, owner string) *waiter {
	w := &waiter{s: s, ch: ch, owner: owner, signal: make(chan struct{})}
	ch.waiters = append(ch.waiters, w)
	return w
}

// wait sleeps until the waiter is signalled, d has passed, ctx ends or the
// Client is closed. It returns the grant that came with the signal, if any.
func (w *waiter) wait(ctx context.Context, d time.Duration) (string, error) {
	w.s.mu.Lock()
	sig := w.signal
	w.s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-sig:
		case <-t.C:
		case <-ctx.Done():
			return "", ctx.Err()
		case <-w.s.closed:
			return "", ErrClosed
		}
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	if !w.fired {
		return "", nil
	}
	grant := w.grant
	w.fired, w.grant, w.signal = false, "", make(chan struct{})
	return grant, nil
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
			if w.owner == grant[:i] {
				w.fire(grant)
			}
		}
	}
}

// confirmed records a subscribe confirmation for a channel.
func (s *subscriber) confirmed(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.channels[name]
	if ch == nil {
		return
	}
	if ch.inflight == 0 {
		// Not one we asked for: go-redis subscribed again after a
		// reconnect, and messages may have been lost meanwhile.
		ch.wakeAll()
		return
	}
	ch.inflight--
	if ch.inflight == 0 && ch.sent && !ch.confirmed {
		ch.confirmed = true
		close(ch.ready)
	}
}

// run reads what Redis sends on the pub/sub connection and dispatches it,
// until the Client is closed. go-redis reconnects and subscribes again by
// itself when a read fails; run pings a silent connection so that a dead
// one fails, and unsubscribes idle channels when they are due.
func (s *subscriber) run(ps *redis.PubSub) {
	defer s.wg.Done()
	backoff := time.Duration(0)
	silent := time.Duration(0)
	for s.ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(s.ctx, time.Second)
		switch {
		case err == nil:
			backoff, silent = 0, 0
			s.dispatch(msg)
		case isTimeout(err):
			if silent += time.Second; silent >= pingAfter {
				silent = 0
				_ = ps.Ping(s.ctx) // a failed write makes go-redis reconnect
			}
		default:
			// Redis is unreachable; go-redis redials on the next read.
			backoff = min(max(2*backoff, 10*time.Millisecond), maxBackoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.closed:
				t.Stop()
			}
		}
		if s.sweepDue(time.Now()) {
			s.sync()
		}
	}
}

// dispatch handles one thing received from Redis.
func (s *subscriber) dispatch(msg any) {
	switch m := msg.(type) {
	case *redis.Message:
		s.deliver(m.Channel, m.Payload)
	case *redis.Subscription:
		if m.Kind == "subscribe" {
			s.confirmed(m.Channel)
		}
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
	var sub, unsub []string
	now := time.Now()
	s.mu.Lock()
	ps := s.ps
	s.nextSweep = time.Time{}
	for name, ch := range s.channels {
		switch {
		case len(ch.waiters) > 0:
			if !ch.sent {
				ch.sent = true
				ch.inflight++
				sub = append(sub, name)
			}
		case ch.sent && now.Sub(ch.idleSince) < lingerFor:
			due := ch.idleSince.Add(lingerFor)
			if s.nextSweep.IsZero() || due.Before(s.nextSweep) {
				s.nextSweep = due
			}
		default:
			if ch.sent {
				ch.sent, ch.confirmed = false, false
				ch.ready = make(chan struct{})
				unsub = append(unsub, name)
			}
			if ch.inflight == 0 {
				delete(s.channels, name)
			}
		}
	}
	s.mu.Unlock()

	// Errors need no handling here: go-redis keeps the set of channels and
	// subscribes them again when it reconnects, which confirms them.
	if len(unsub) > 0 {
		_ = ps.Unsubscribe(s.ctx, unsub...)
	}
	if len(sub) > 0 {
		_ = ps.Subscribe(s.ctx, sub...)
	}
}

// wait closes the connection after the Client was closed, and waits for
// run to exit.
func (s *subscriber) wait() {
	s.mu.Lock()
	ps := s.ps
	s.mu.Unlock()
	if ps != nil {
		_ = ps.Close() // unblocks run's read
	}
	s.wg.Wait()
}

// isTimeout reports whether err is a read timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
