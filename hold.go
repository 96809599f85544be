package redisync

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// errHeld is returned by holds.take when the value holds already: another
// call of the same value took a hold first.
var errHeld = errors.New("redisync: the value holds already")

// errExpired is returned by holds.take when the hold's lease may have run
// out in Redis before the reply that granted it arrived.
var errExpired = errors.New("redisync: the hold's lease ran out before it was granted")

// hold is what a Mutex or Semaphore value knows of one hold: a lock, with
// the levels the value re-entered it, or permits of a semaphore.
type hold struct {
	id    string        // the hold's field in Redis
	token int64         // fencing token (a Mutex's)
	n     int64         // levels (a Mutex) or permits (a Semaphore) held
	lost  chan struct{} // closed when the hold is lost
	cause error         // why it ended: ErrLockLost or ErrReleased; nil while it lasts
	// cancels are the hold's contexts (see holds.context), cancelled
	// when it ends.
	cancels map[*context.CancelCauseFunc]struct{}
	isLost  bool
	freed   bool       // a confirmed release ended it (a Semaphore's holding)
	ka      *keepalive // its watchdog entry
	taken   time.Time  // when it was taken, for events
	handoff bool       // taken by a hand-off: a fair lock's release, or Accept
	given   bool       // given to another process by Handoff
}

// holds is the hold lifecycle that Mutex and Semaphore share. A value has
// at most one hold at a time. A call that was granted one takes it; while
// it lasts the watchdog renews its lease (or only watches its fixed
// deadline) and loses it when a renewal finds it gone or its deadline
// passes unrenewed; the value forgets it when it is released.
//
// A hold's deadline is counted from a moment known to come before Redis
// set its lease (the sending of the call that set it, or, for a hold
// handed over by another call's release, the last time Redis confirmed
// the waiter was still queued), never from when the news arrived, so that
// the holder hears of a loss before Redis can let anyone else in, at any
// network latency.
//
// Each hold is told to the Client's events queue once when taken and once
// when it ends, lost or released.
type holds struct {
	c      *Client
	prim   Primitive // for events
	name   string
	quiet  bool // tells no events: a RedMutex's node, whose RedMutex tells its own
	mu     sync.Mutex
	cur    *hold
	taken  chan struct{} // closed, and replaced, when a hold is taken
	onLost func()        // called with mu held when the current hold is lost
}

func newHolds(c *Client, prim Primitive, name string) holds {
	return holds{c: c, prim: prim, name: name, taken: make(chan struct{})}
}

// take makes h the value's hold; its lease of length lease was set in
// Redis no earlier than since. e, its watchdog entry, is registered. It
// fails, having changed nothing, with errHeld when the value holds already,
// errExpired when the lease may have run out already, and ErrClosed when
// the Client is closed: the caller then gives the hold back.
func (s *holds) take(ctx context.Context, h *hold, e *keepalive, since time.Time, lease time.Duration) error {
	if !time.Now().Before(since.Add(lease - drift(lease))) {
		return errExpired
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		return errHeld
	}
	h.lost, h.ka = make(chan struct{}), e
	e.gone = func() { s.lose(h) }
	if !s.c.wd.add(e, since, lease) {
		return ErrClosed
	}
	s.cur = h
	close(s.taken)
	s.taken = make(chan struct{})
	h.taken = time.Now()
	s.emit(KindHoldTaken, h, nil)
	noteHold(ctx, h)
	return nil
}

// heldKey is the key of a context value, a *heldSlot, by which do learns
// which hold the call it made took or re-entered.
type heldKey struct{}

// heldSlot is where a call that takes or re-enters a hold notes it.
type heldSlot struct{ h atomic.Pointer[hold] }

// noteHold tells do, if ctx is one of its calls', that the call took or
// re-entered h.
func noteHold(ctx context.Context, h *hold) {
	if s, ok := ctx.Value(heldKey{}).(*heldSlot); ok {
		s.h.Store(h)
	}
}

// emit tells the events queue that h was taken or ended. s.mu must be held.
func (s *holds) emit(kind Kind, h *hold, err error) {
	if s.c.events == nil || s.quiet {
		return
	}
	e := Event{Kind: kind, Primitive: s.prim, Name: s.name, Token: h.token, Handoff: h.given, Err: err}
	if s.prim == PrimitiveSemaphore {
		e.Permits = h.n
	}
	if kind == KindHoldTaken {
		e.Handoff = h.handoff
	} else {
		e.Held = time.Since(h.taken)
	}
	s.c.events.emit(e)
}

// current returns the value's hold, or nil. Its fields are guarded by s.mu.
func (s *holds) current() *hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// changed returns a channel closed when the value next takes a hold.
func (s *holds) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.taken
}

// lose closes h's Lost channel and stops its renewal, unless h is no longer
// the value's hold or was lost already.
func (s *holds) lose(h *hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseLocked(h)
}

// loseLocked is lose with s.mu held.
func (s *holds) loseLocked(h *hold) {
	if s.cur != h || h.isLost {
		return
	}
	h.isLost = true
	// Told before Lost is closed: a caller that closes its Client once
	// Lost is closed still has the event delivered.
	switch {
	case h.given:
		// Handoff tells how it ended once Redis answered (see told).
	case s.c.ctx.Err() != nil: // the Client is closing, and releases it
		s.emit(KindHoldReleased, h, ErrClosed)
	default:
		s.emit(KindHoldLost, h, nil)
	}
	close(h.lost)
	end(h, ErrLockLost)
	s.c.wd.remove(h.ka)
	if s.onLost != nil {
		s.onLost()
	}
}

// forgetLocked drops h, the value's hold, before its release is sent: no
// renewal may outlive the release. s.mu must be held.
func (s *holds) forgetLocked(h *hold) {
	if h.cause == nil {
		s.emit(KindHoldReleased, h, nil)
	}
	s.forgetUntoldLocked(h)
}

// forgetUntoldLocked is forgetLocked for a hold that lasts until its
// release is sent, and whose end the caller tells once Redis answered it
// (see told): the release may find that Redis no longer had it. s.mu must
// be held.
func (s *holds) forgetUntoldLocked(h *hold) {
	s.c.wd.remove(h.ka)
	end(h, ErrReleased)
	if s.cur == h {
		s.cur = nil
	}
}

// told tells the events queue how h, forgotten untold before its release
// (or its hand-off) was sent, ended: lost when the release found that
// Redis no longer had it (gone), else released.
func (s *holds) told(h *hold, gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gone {
		h.given = false
		s.emit(KindHoldLost, h, nil)
		return
	}
	s.emit(KindHoldReleased, h, nil)
}

// end records that h ended for cause, unless it had ended already, and
// cancels its contexts at once: by the time Lost is closed, or Unlock has
// forgotten the hold, they are done. The value's mu must be held.
func end(h *hold, cause error) {
	if h.cause != nil {
		return
	}
	h.cause = cause
	for c := range h.cancels {
		(*c)(cause)
	}
	h.cancels = nil
}

// context returns a context that is cancelled when the value's current
// hold ends, with cause ErrLockLost or ErrReleased, or when parent ends;
// with cause ErrNotHeld at once when the value holds nothing. Its
// CancelFunc forgets it.
func (s *holds) context(parent context.Context) (context.Context, context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return holdContext(&s.mu, s.cur, parent)
}

// holdContext is holds.context for the hold h (nil: none) guarded by mu,
// which the caller holds; the CancelFunc takes it.
func holdContext(mu *sync.Mutex, h *hold, parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	switch {
	case h == nil:
		cancel(ErrNotHeld)
		return ctx, func() {}
	case h.cause != nil:
		cancel(h.cause)
		return ctx, func() {}
	}
	if h.cancels == nil {
		h.cancels = make(map[*context.CancelCauseFunc]struct{})
	}
	key := &cancel
	h.cancels[key] = struct{}{}
	return ctx, func() {
		mu.Lock()
		delete(h.cancels, key)
		mu.Unlock()
		cancel(context.Canceled)
	}
}

// do takes a hold with acquire, runs fn with the hold's context, and gives
// it back with release, even when fn failed or the hold was lost: it
// returns fn's error joined with release's. When the value's hold is not
// the one acquire took any more (it was lost, and another goroutine of the
// value took the lock anew; or another goroutine released it), it is not
// released: that is not this call's to give back; a loss is reported.
func (s *holds) do(ctx context.Context, acquire, release func(context.Context) error, fn func(context.Context) error) error {
	return do(ctx, &s.mu, &s.cur, acquire, release, fn)
}

// do is holds.do for a value whose current hold is *cur, guarded by mu: a
// Mutex's or Semaphore's holds, or a RedMutex.
func do(ctx context.Context, mu *sync.Mutex, cur **hold, acquire, release func(context.Context) error, fn func(context.Context) error) error {
	slot := &heldSlot{}
	if err := acquire(context.WithValue(ctx, heldKey{}, slot)); err != nil {
		return err
	}
	mu.Lock()
	h := slot.h.Load() // the hold acquire took or re-entered
	if h == nil || *cur != h {
		// Another goroutine of the value released it at once; or it
		// was lost, and another goroutine took the lock anew: that
		// hold is not this call's to run fn under, or to release.
		lost := h != nil && h.cause == ErrLockLost
		mu.Unlock()
		if lost {
			return ErrLockLost
		}
		return ErrNotHeld
	}
	hctx, cancel := holdContext(mu, h, ctx)
	mu.Unlock()
	err := fn(hctx)
	cancel()
	mu.Lock()
	ours, cause := *cur == h, h.cause
	mu.Unlock()
	switch {
	case ours:
		return errors.Join(err, release(ctx))
	case cause == ErrLockLost:
		return errors.Join(err, ErrLockLost)
	}
	return err // released meanwhile by another goroutine of the value
}

// token returns the fencing token of the value's hold, or 0.
func (s *holds) token() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.token
}

// lostChan returns the Lost channel of the value's hold, or nil.
func (s *holds) lostChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil
	}
	return s.cur.lost
}
