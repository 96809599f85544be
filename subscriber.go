package redisync

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// lingerFor is how long a channel stays subscribed after its last waiter
// left, so that a lock under steady contention does not pay a SUBSCRIBE and
// an UNSUBSCRIBE for every wait.
const lingerFor = 2 * time.Second

// subscriber multiplexes every waiter of a Client over one pub/sub
// connection. Channels are reference counted by their waiters: the first
// waiter of a channel has it subscribed, and it is unsubscribed a little
// after the last one leaves. Only the run goroutine writes SUBSCRIBE and
// UNSUBSCRIBE, so they reach Redis in the order they were decided.
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
	poke   chan struct{}   // wakes run to sync subscriptions; never blocks
	wg     sync.WaitGroup

	mu       sync.Mutex
	started  bool
	channels map[string]*channel
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
		poke:     make(chan struct{}, 1),
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
	if !s.started {
		s.started = true
		s.wg.Add(1)
		go s.run()
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
		s.wake()
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
		s.wake()
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

// wake asks run to sync the subscriptions.
func (s *subscriber) wake() {
	select {
	case s.poke <- struct{}{}:
	default: // a sync is already pending
	}
}

// run owns the pub/sub connection: it writes subscription changes and
// dispatches what Redis sends, until the Client is closed.
func (s *subscriber) run() {
	defer s.wg.Done()
	ps := s.rdb.Subscribe(s.ctx)
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	defer func() {
		_ = ps.Close()
		for range msgs { // let go-redis's reader exit
		}
	}()

	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	for {
		select {
		case <-s.closed:
			return
		case <-s.poke:
		case <-linger.C:
		case m, ok := <-msgs:
			if !ok {
				return
			}
			switch m := m.(type) {
			case *redis.Message:
				s.deliver(m.Channel, m.Payload)
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					s.confirmed(m.Channel)
				}
			}
			continue
		}
		next := s.sync(ps)
		linger.Reset(next)
	}
}

// sync subscribes channels that have waiters and are not subscribed, and
// unsubscribes those idle for lingerFor. It returns how long until the next
// idle channel is due.
func (s *subscriber) sync(ps *redis.PubSub) time.Duration {
	var sub, unsub []string
	next := time.Hour
	now := time.Now()
	s.mu.Lock()
	for name, ch := range s.channels {
		switch {
		case len(ch.waiters) > 0:
			if !ch.sent {
				ch.sent = true
				ch.inflight++
				sub = append(sub, name)
			}
		case ch.sent:
			if idle := now.Sub(ch.idleSince); idle < lingerFor {
				next = min(next, lingerFor-idle)
				continue
			}
			ch.sent, ch.confirmed = false, false
			ch.ready = make(chan struct{})
			unsub = append(unsub, name)
			fallthrough
		default:
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
	return next
}

// wait waits for run to exit after the Client was closed.
func (s *subscriber) wait() { s.wg.Wait() }
