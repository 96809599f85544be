package redisync

import "time"

// listener hears every message published on a channel of the Client's
// subscriber, where a waiter is woken only by what is addressed to it: an
// Election's observer (Election.Observe) listens to the election's
// changes. It is told each time the channel's subscription is confirmed,
// the first time and again after a reconnect: messages may have been
// missed before. Both functions are called with the registry's mutex
// held: they must not block nor call the registry.
type listener struct {
	hear   func(payload string)
	resync func()
}

// idle reports whether the channel has neither waiters nor listeners.
// r.mu must be held.
func (ch *channel) idle() bool { return len(ch.waiters) == 0 && len(ch.listeners) == 0 }

// hear tells every listener of the channel a message. r.mu must be held.
func (ch *channel) hear(payload string) {
	for _, l := range ch.listeners {
		l.hear(payload)
	}
}

// resync tells every listener that the channel's subscription is
// confirmed. r.mu must be held.
func (ch *channel) resync() {
	for _, l := range ch.listeners {
		l.resync()
	}
}

// listen registers l on the named channel. It reports false when the
// registry is closed.
func (r *registry) listen(name string, l *listener) bool {
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
		l.resync() // subscribed already: nothing can be missed from here on
	}
	return true
}

// unlisten unregisters l from the named channel.
func (r *registry) unlisten(name string, l *listener) {
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

// listen registers l on the named channel, has the channel subscribed if
// it is not, and runs run in a goroutine that Close waits for; l is
// unregistered when run returns. It returns ErrClosed after Close.
func (s *subscriber) listen(name string, l *listener, run func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil || !s.reg.listen(name, l) {
		return ErrClosed
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.reg.unlisten(name, l)
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
