// Package waiters keeps the waiter bookkeeping of one pub/sub subscriber:
// which blocked calls wait on which channel, which of them a message wakes,
// and who hears every message of a channel. It does no I/O: the
// subscriber tells a Registry what Redis said (a subscription confirmed or
// lapsed, a message), and a blocked call sleeps on its Set.
package waiters

import (
	"cmp"
	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DeafPoll is the longest a waiter sleeps while one of its channels is not
// confirmed (a subscription not confirmed yet, a connection being
// re-established): messages cannot reach it then.
const DeafPoll = 250 * time.Millisecond

// Registry records which waiters wait on which channel of one subscriber,
// and wakes them. It is a plain data structure, safe for concurrent use,
// that does no I/O: the subscriber tells it what Redis said (a
// subscription confirmed or lapsed, a message) and asks it which channels
// have waiters.
//
// A message wakes waiters: an empty one wakes the first plain waiter (of
// a barging lock) of the channel that has no signal pending, in arrival
// order, and one of the form "ticket:token ..." signals the waiters of
// those tickets and hands them the grant. A waiter that leaves with a
// plain signal it did not use passes it to the next plain waiter of its
// channel, so that leaving never swallows a wake-up meant for the
// process. When the channel has no plain waiter left to take one, the
// registry tells unheard, which passes it on to another process (see
// wakePlain).
//
// A channel is confirmed while Redis is known to deliver its messages.
// Until then its waiters cannot rely on messages: they sleep at most
// DeafPoll, and those that went on before the confirmation are all woken
// when it comes, since a message may have been missed meanwhile.
type Registry struct {
	mu        sync.Mutex // taken before a Set's mu, never after
	channels  map[string]*channel
	unheard   func(name string) // told a wake-up that no plain waiter took; must not block; may be nil
	errClosed error             // what a wait returns once the registry is closed
	idle      time.Time         // the earliest idleSince of a channel kept without waiters
	closed    bool
}

// channel is one pub/sub channel with waiters, or lingering without.
type channel struct {
	name      string
	waiters   []*waiter
	ready     chan struct{} // closed when the channel is confirmed
	confirmed bool
	missed    bool      // waiters went on while it was not confirmed: wake them all when it is
	idleSince time.Time // when the last waiter left
	hadPlain  bool      // a plain waiter waited on it: its Client may be recorded as having one

	listeners []*Listener // hear every message
}

// waiter is one member of a Set, registered on one channel.
type waiter struct {
	r      *Registry
	ch     *channel
	set    *Set
	ticket string // the call's address in grant messages; guarded by r.mu
	plain  bool   // woken by empty messages (a barging lock's waiter)

	// Guarded by set.mu.
	fired bool   // signalled, and not consumed yet
	grant string // "ticket:token" received with the signal, if any
	woke  bool   // consumed a plain signal that no attempt used yet
}

// Set is what one blocked call waits on: a waiter on each of its
// channels (one for a Mutex or a Semaphore, one per node for a RedMutex).
// A signal to any of them wakes the call, by closing the set's bell.
type Set struct {
	members []*waiter // added by the call's goroutine as it joins; read-only from then on

	mu   sync.Mutex
	bell chan struct{} // closed when a member is signalled; replaced once consumed
	rung bool
}

// New returns a registry that tells unheard (if not nil) each wake-up
// that no plain waiter took; a wait returns errClosed once it is closed.
func New(unheard func(name string), errClosed error) *Registry {
	return &Registry{channels: make(map[string]*channel), unheard: unheard, errClosed: errClosed}
}

// NewSet returns a Set with no member: its call registers one on each of
// its channels (Registry.Add).
func NewSet() *Set {
	return &Set{bell: make(chan struct{})}
}

// Add registers a new member of set for ticket on the named channel, and
// returns a channel that is closed once the channel is confirmed. A plain
// member is woken by empty messages. It reports false, and registers
// nothing, when the registry is closed.
func (r *Registry) Add(set *Set, name, ticket string, plain bool) (ready <-chan struct{}, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, false
	}
	ch := r.channels[name]
	if ch == nil {
		ch = &channel{name: name, ready: make(chan struct{})}
		r.channels[name] = ch
	}
	r.register(set, ch, ticket, plain)
	return ch.ready, true
}

// AddConfirmed registers a new member of set for ticket on the named
// channel, and reports true, if the channel is confirmed. plain is as for
// Add.
func (r *Registry) AddConfirmed(set *Set, name, ticket string, plain bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[name]
	if r.closed || ch == nil || !ch.confirmed {
		return false
	}
	r.register(set, ch, ticket, plain)
	return true
}

// register appends a new member of set to ch. r.mu must be held.
func (r *Registry) register(set *Set, ch *channel, ticket string, plain bool) {
	w := &waiter{r: r, ch: ch, set: set, ticket: ticket, plain: plain}
	ch.hadPlain = ch.hadPlain || plain
	ch.waiters = append(ch.waiters, w)
	set.members = append(set.members, w)
}

// Leave unregisters w. A plain signal that it did not consume, or, with
// passOn, that it consumed and no attempt used, goes to the next waiter
// of the channel.
func (r *Registry) leave(w *waiter, passOn bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := w.ch
	for i, x := range ch.waiters {
		if x == w {
			ch.waiters = append(ch.waiters[:i], ch.waiters[i+1:]...)
			break
		}
	}
	w.set.mu.Lock()
	unused := (w.fired || (passOn && w.woke)) && w.grant == ""
	w.set.mu.Unlock()
	switch {
	case unused && w.plain:
		r.wakePlain(ch)
	case unused:
		// A fair waiter's plain signal is a hint to look again (a
		// reconnect, a heartbeat's nudge, an empty message no plain
		// waiter took, passed on already): the next waiter takes it.
		ch.wakeNext()
	}
	if ch.idle() {
		ch.idleSince = time.Now()
		if r.idle.IsZero() {
			r.idle = ch.idleSince
		}
	}
}

// Proceed records that w's call goes on before w's channel is confirmed:
// every waiter of the channel is woken when it is.
func (r *Registry) proceed(w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.ch.missed = w.ch.missed || !w.ch.confirmed
}

// Retarget makes ticket the address of w in grant messages.
func (r *Registry) retarget(w *waiter, ticket string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.ticket = ticket
}

// unconfirmed reports whether w's channel is not confirmed: messages may
// not reach it.
func (r *Registry) unconfirmed(w *waiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !w.ch.confirmed
}

// isClosed reports whether the registry is closed.
func (r *Registry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Deliver routes a message to the channel's waiters.
func (r *Registry) Deliver(name, payload string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[name]
	if ch == nil {
		if payload == "" && r.unheard != nil && !r.closed {
			r.unheard(name) // swept, its UNSUBSCRIBE not sent yet
		}
		return
	}
	ch.hear(payload)
	if payload == "" {
		r.wakePlain(ch)
		return
	}
	for _, grant := range strings.Fields(payload) {
		address, _, _, ok := ParseGrant(grant)
		if !ok {
			continue
		}
		for _, w := range ch.waiters {
			if w.ticket == address {
				w.fire(grant)
			}
		}
	}
}

// Confirm records that Redis confirmed the channel's subscription. A
// confirmation of a channel confirmed already was not asked for: the
// client subscribed again after a reconnect, and messages may have been
// lost meanwhile, so every waiter looks again (see missed).
func (r *Registry) Confirm(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[name]
	switch {
	case ch == nil:
	case ch.confirmed:
		r.missed(ch)
		ch.resync()
	default:
		ch.resync()
		ch.confirmed = true
		close(ch.ready)
		if ch.missed {
			ch.missed = false
			r.missed(ch)
		}
	}
}

// missed wakes every waiter of ch, which may have missed messages. When
// plain waiters waited on ch, and have all gone since, a wake-up of them
// that was missed is passed on (unheard), as wakePlain does. r.mu must be
// held.
func (r *Registry) missed(ch *channel) {
	ch.wakeAll()
	if !ch.hadPlain {
		return
	}
	for _, w := range ch.waiters {
		if w.plain {
			return
		}
	}
	if r.unheard != nil && !r.closed {
		r.unheard(ch.name)
	}
}

// Lapse records that the channel's subscription may have lost messages (its
// connection failed) and is no longer confirmed: every waiter looks again
// once it is confirmed anew. A channel left without waiters is not
// subscribed anew: a wake-up of plain waiters that it may have lost is
// passed on now (see missed).
func (r *Registry) Lapse(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[name]
	if ch == nil {
		return
	}
	ch.missed = true
	if ch.confirmed {
		ch.confirmed = false
		ch.ready = make(chan struct{})
	}
	if len(ch.waiters) == 0 && ch.hadPlain && r.unheard != nil && !r.closed {
		r.unheard(name)
	}
}

// HasWaiters reports whether the named channel has waiters.
func (r *Registry) HasWaiters(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[name]
	return ch != nil && !ch.idle()
}

// IdleSince returns the earliest time a channel kept without waiters was
// left by its last one, or zero when there is none.
func (r *Registry) IdleSince() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idle
}

// Sweep forgets each channel without waiters for which drop, given the
// channel's name and when its last waiter left, reports true, and returns
// the names of the channels with waiters. drop is called with r.mu held.
func (r *Registry) Sweep(drop func(name string, idleSince time.Time) bool) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var wanted []string
	r.idle = time.Time{}
	for name, ch := range r.channels {
		switch {
		case !ch.idle():
			wanted = append(wanted, name)
		case drop(name, ch.idleSince):
			delete(r.channels, name)
		case r.idle.IsZero() || ch.idleSince.Before(r.idle):
			r.idle = ch.idleSince
		}
	}
	return wanted
}

// Close wakes every waiter, whose wait then returns the registry's closed
// error, and
// registers none from then on.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, ch := range r.channels {
		for _, w := range ch.waiters {
			w.set.ring()
		}
	}
}

// Wake has a waiter of the named channel look again, as an empty message
// does (see wakePlain), but without passing the wake-up on to another
// process when no plain waiter takes it: for the testing kit (module
// redisynctest), which wakes every process's waiters itself. A wake-up is
// a hint: a waiter that finds nothing to take sleeps again.
func (r *Registry) Wake(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch := r.channels[name]; ch != nil {
		r.wake(ch)
	}
}

// WakeAll has a waiter of every channel look again, as Wake does.
func (r *Registry) WakeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range r.channels {
		r.wake(ch)
	}
}

// wake wakes the first plain waiter of ch with no signal pending, or else
// the first waiter with none. r.mu must be held.
func (r *Registry) wake(ch *channel) {
	for _, w := range ch.waiters {
		if w.plain && !w.pending() {
			w.fire("")
			return
		}
	}
	ch.wakeNext()
}

// wakePlain wakes a waiter of ch with an empty message's wake-up: the
// first plain waiter with no signal pending; none when every plain waiter
// has one pending (each will look again). When ch has no plain waiter,
// unheard is told, to pass the wake-up on to another process, and the
// first waiter with no signal pending, if any, looks again all the same
// (an empty message is a hint to look again). r.mu must be held.
func (r *Registry) wakePlain(ch *channel) {
	plain := false
	for _, w := range ch.waiters {
		if w.plain {
			if !w.pending() {
				w.fire("")
				return
			}
			plain = true
		}
	}
	if plain {
		return
	}
	if r.unheard != nil && !r.closed {
		r.unheard(ch.name)
	}
	ch.wakeNext()
}

// wakeNext signals the first waiter of ch with no signal pending, if any.
// r.mu must be held.
func (ch *channel) wakeNext() {
	for _, w := range ch.waiters {
		if !w.pending() {
			w.fire("")
			return
		}
	}
}

// PlainOthers reports whether the named channel has a plain waiter whose
// ticket is not ticket.
func (r *Registry) PlainOthers(name, ticket string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch := r.channels[name]; ch != nil {
		for _, w := range ch.waiters {
			if w.plain && w.ticket != ticket {
				return true
			}
		}
	}
	return false
}

// wakeAll signals every waiter. r.mu must be held.
func (ch *channel) wakeAll() {
	for _, w := range ch.waiters {
		w.fire("")
	}
}

// pending reports whether w has a signal not consumed yet.
func (w *waiter) pending() bool {
	w.set.mu.Lock()
	defer w.set.mu.Unlock()
	return w.fired
}

// fire signals w, keeping a grant that came with an earlier signal.
func (w *waiter) fire(grant string) {
	s := w.set
	s.mu.Lock()
	defer s.mu.Unlock()
	if grant != "" {
		w.grant = grant
	}
	w.fired = true
	s.ringLocked()
}

// ring wakes the set's call without signalling a member.
func (s *Set) ring() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ringLocked()
}

// ringLocked is ring with s.mu held.
func (s *Set) ringLocked() {
	if !s.rung {
		s.rung = true
		close(s.bell)
	}
}

// Wait sleeps until a member is signalled, d has passed, ctx ends or a
// registry of the set is closed (its closed error); while a
// member's channel is not confirmed, it sleeps at most DeafPoll. It
// consumes every signal received, and returns the grant that came with
// one, if any.
func (s *Set) Wait(ctx context.Context, d time.Duration) (string, error) {
	s.mu.Lock()
	bell := s.bell
	s.mu.Unlock()
	for _, w := range s.members {
		if w.r.unconfirmed(w) {
			d = min(d, DeafPoll)
		}
	}
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-bell:
		case <-t.C:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	// Consumed before the registries are asked whether they are closed: a
	// registry is marked closed before it rings, so a ring that consume
	// takes is never missed (the call would sleep on a bell nobody rings).
	grant := s.consume()
	for _, w := range s.members {
		if w.r.isClosed() {
			return "", w.r.errClosed
		}
	}
	return grant, nil
}

// consume takes every member's signal, and returns a grant that came with
// one, if any. A member that took a plain signal counts as woken until
// Used is called, through later waits that bring none (an attempt that
// failed for a moment did not use it).
func (s *Set) consume() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	grant := ""
	for _, w := range s.members {
		w.woke = w.woke || (w.fired && w.grant == "")
		grant = cmp.Or(grant, w.grant)
		w.fired, w.grant = false, ""
	}
	if s.rung {
		s.rung, s.bell = false, make(chan struct{})
	}
	return grant
}

// Used records that an attempt used the plain signals consumed so far.
func (s *Set) Used() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.members {
		w.woke = false
	}
}

// Nudge signals the set's call to look again.
func (s *Set) Nudge() {
	s.members[0].fire("")
}

// Retarget makes ticket the call's address in grant messages.
func (s *Set) Retarget(ticket string) {
	for _, w := range s.members {
		w.r.retarget(w, ticket)
	}
}

// Proceed records that the call goes on before every channel of the set is
// confirmed: the waiters of those channels are all woken when they are.
func (s *Set) Proceed() {
	for _, w := range s.members {
		w.r.proceed(w)
	}
}

// Leave unregisters every member. With passOn, the plain signals that the
// call consumed and did not use go to the next waiters, as do those it did
// not consume.
func (s *Set) Leave(passOn bool) {
	for _, w := range s.members {
		w.r.leave(w, passOn)
	}
}

// Listener hears every message published on a channel, where a waiter is
// woken only by what is addressed to it: an Election's observer listens
// to the election's changes. It is told each time the channel's subscription is confirmed,
// the first time and again after a reconnect: messages may have been
// missed before. Both functions are called with the registry's mutex
// held: they must not block nor call the registry.
type Listener struct {
	Hear   func(payload string)
	Resync func()
}

// idle reports whether the channel has neither waiters nor listeners.
// r.mu must be held.
func (ch *channel) idle() bool { return len(ch.waiters) == 0 && len(ch.listeners) == 0 }

// hear tells every listener of the channel a message. r.mu must be held.
func (ch *channel) hear(payload string) {
	for _, l := range ch.listeners {
		l.Hear(payload)
	}
}

// resync tells every listener that the channel's subscription is
// confirmed. r.mu must be held.
func (ch *channel) resync() {
	for _, l := range ch.listeners {
		l.Resync()
	}
}

// Listen registers l on the named channel. It reports false when the
// registry is closed.
func (r *Registry) Listen(name string, l *Listener) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	ch := r.channels[name]
	if ch == nil {
		ch = &channel{name: name, ready: make(chan struct{})}
		r.channels[name] = ch
	}
	ch.listeners = append(ch.listeners, l)
	if ch.confirmed {
		l.Resync() // subscribed already: nothing can be missed from here on
	}
	return true
}

// Unlisten unregisters l from the named channel.
func (r *Registry) Unlisten(name string, l *Listener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[name]
	if ch == nil {
		return
	}
	for i, x := range ch.listeners {
		if x == l {
			ch.listeners = append(ch.listeners[:i], ch.listeners[i+1:]...)
			break
		}
	}
	if ch.idle() {
		ch.idleSince = time.Now()
		if r.idle.IsZero() {
			r.idle = ch.idleSince
		}
	}
}

// splitGrant splits a grant message, "address:value:ms" (ms: the server
// time of the grant), into its parts. A grant published by an earlier
// version, "address:value", has ms 0. An address has no ':' after its
// last '/' (see internal/schema, Client).
func ParseGrant(grant string) (address string, value, ms int64, ok bool) {
	i := strings.LastIndexByte(grant, ':')
	if i < 0 {
		return "", 0, 0, false
	}
	last, err := strconv.ParseInt(grant[i+1:], 10, 64)
	if err != nil {
		return "", 0, 0, false
	}
	if j := strings.LastIndexByte(grant[:i], ':'); j > strings.LastIndexByte(grant, '/') {
		v, err := strconv.ParseInt(grant[j+1:i], 10, 64)
		return grant[:j], v, last, err == nil
	}
	return grant[:i], last, 0, true
}

// Waiters reports how many waiters wait on the named channel, how many of
// them are plain, and whether the channel is confirmed; all zero when the
// registry does not know the channel (never used, or swept).
func (r *Registry) Waiters(name string) (all, plain int, confirmed, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.channels[name]
	if ch == nil {
		return 0, 0, false, false
	}
	for _, w := range ch.waiters {
		if w.plain {
			plain++
		}
	}
	return len(ch.waiters), plain, ch.confirmed, true
}
