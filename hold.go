package redisync

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/watchdog"
)

// errBusy is returned, by a call that does not wait, when the value's
// last hold was lost and its Unlock is still owed.
var errBusy = errors.New("redisync: a lost hold of the value is not released yet")

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
	freed   bool            // a confirmed release ended it (a Semaphore's holding)
	ka      *watchdog.Entry // its watchdog entry
	taken   time.Time       // when it was taken, for events
	handoff bool            // taken by a hand-off: a fair lock's release, or Accept
	given   bool            // given to another process by Handoff
	// refuse is set when a call that took the hold sent something whose
	// reply never came: a copy of it may still be on its way, and its
	// ticket (a Semaphore's holder id) is refused when the hold ends.
	refuse bool
	// parts are the holds it is made of, in their Mutex values: a
	// MultiMutex's hold has one per name, in the global order; a
	// RedMutex's one per node it holds (nil for the others), of which
	// alive are not lost.
	parts []*Mutex
	alive int
}

// holds is the hold lifecycle that Mutex and Semaphore share. A value has
// at most one hold at a time, from the call that took it to its last
// release, lost or not: a Mutex's call granted the lock while the value
// still has a hold (lost, its last Unlock not made yet) waits for that
// Unlock before it returns, as a sync.Mutex's Lock waits for the Unlock
// of the goroutine that holds it. While a hold lasts the watchdog renews
// its lease (or only watches its fixed deadline) and loses it when a
// renewal finds it gone or its deadline passes unrenewed; the value
// forgets it when it is released.
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
	free   chan struct{} // closed when cur, the hold it was made for, is forgotten
	onLost func()        // called with mu held when the current hold is lost
}

func newHolds(c *Client, prim Primitive, name string) holds {
	return holds{c: c, prim: prim, name: name}
}

// take makes h the value's hold; its lease of length lease was set in
// Redis no earlier than since. e, its watchdog entry, is registered at
// once, so that h is renewed while it waits (wait) for the value's hold
// before it, gone from Redis but not found lost yet, to end. It fails,
// having left h unregistered, with errExpired when the lease may have run
// out already (or h was lost while it waited), errBusy when that hold is
// lost (its Unlock is owed: the caller gives h back and waits for that
// Unlock holding nothing, see owedUnlock) or when it would wait and may
// not, ctx's error when ctx ends first, and ErrClosed when the Client is
// closed: the caller then gives h back.
func (s *holds) take(ctx context.Context, h *hold, e *watchdog.Entry, since time.Time, lease time.Duration, wait bool) error {
	if !time.Now().Before(since.Add(lease - watchdog.Drift(lease))) {
		return errExpired
	}
	h.lost, h.ka = make(chan struct{}), e
	e.Gone = func() { s.lose(h) }
	if !s.c.wd.Add(e, since, lease) {
		return ErrClosed
	}
	for {
		s.mu.Lock()
		if h.isLost {
			s.mu.Unlock()
			return errExpired
		}
		if s.cur == nil {
			s.cur, s.free = h, make(chan struct{})
			h.taken = time.Now()
			s.emit(EventHoldTaken, h, nil)
			s.mu.Unlock()
			noteHold(ctx, s, h)
			return nil
		}
		owed, curLost, free := s.cur.isLost, s.cur.lost, s.free
		s.mu.Unlock()
		if owed || !wait {
			s.c.wd.Remove(e)
			return errBusy
		}
		select {
		case <-free:
		case <-curLost: // its Unlock is owed now
		case <-h.lost:
		case <-ctx.Done():
			s.c.wd.Remove(e)
			return ctx.Err()
		case <-s.c.ctx.Done():
			s.c.wd.Remove(e)
			return ErrClosed
		}
	}
}

// owedUnlock waits while the value's last hold was lost and its Unlock is
// still owed (owed returns the channel closed by that Unlock, nil when
// nothing is owed; it is called with mu held), so that a call queues in
// Redis only once that Unlock came: a call granted the lock meanwhile
// would hold it in Redis, renewed, until then, keeping every other
// process out (a candidate that campaigns again and never resigns its
// lost leadership would stop the whole election). With wait false it
// returns errBusy instead of waiting. It returns ctx's error, or
// ErrClosed when closed is closed first.
func owedUnlock(ctx context.Context, mu *sync.Mutex, owed func() <-chan struct{}, closed <-chan struct{}, wait bool) error {
	for {
		mu.Lock()
		free := owed()
		mu.Unlock()
		switch {
		case free == nil:
			return nil
		case !wait:
			return errBusy
		}
		select {
		case <-free:
		case <-ctx.Done():
			return ctx.Err()
		case <-closed:
			return ErrClosed
		}
	}
}

// owed returns the channel that the Unlock owed to the value's lost hold
// closes, or nil when no Unlock is owed. s.mu must be held.
func (s *holds) owed() <-chan struct{} {
	if s.cur != nil && s.cur.isLost {
		return s.free
	}
	return nil
}

// owedUnlock is owedUnlock for the value whose holds s are.
func (s *holds) owedUnlock(ctx context.Context, wait bool) error {
	return owedUnlock(ctx, &s.mu, s.owed, s.c.ctx.Done(), wait)
}

// reenter adds a level to h, a hold of owner (guarded by mu) that ctx
// carries, unless h has ended (it returns why: ErrLockLost, ErrReleased)
// or ctx has.
func reenter(ctx context.Context, mu *sync.Mutex, owner any, h *hold) error {
	mu.Lock()
	if h.isLost || h.cause != nil {
		mu.Unlock()
		return cmp.Or(h.cause, ErrLockLost)
	}
	if err := ctx.Err(); err != nil {
		mu.Unlock()
		return err
	}
	h.n++
	mu.Unlock()
	noteHold(ctx, owner, h)
	return nil
}

// heldKey is the key of a context value, a *heldSlot, by which do learns
// which hold the call it made took or re-entered.
type heldKey struct{}

// heldSlot is where a call that takes or re-enters a hold of owner notes
// it. Holds of other owners that the call takes on its way (a RedMutex's
// node holds, a MultiMutex's parts) are not noted: an attempt on a slow
// node may take one after the call returned.
type heldSlot struct {
	owner any
	h     atomic.Pointer[hold]
}

// noteHold tells do, if ctx is one of its calls', that the call took or
// re-entered h.
func noteHold(ctx context.Context, owner any, h *hold) {
	if s, ok := ctx.Value(heldKey{}).(*heldSlot); ok && s.owner == owner {
		s.h.Store(h)
	}
}

// emit tells the events queue that h was taken or ended. s.mu must be held.
func (s *holds) emit(kind EventKind, h *hold, err error) {
	if s.c.events == nil || s.quiet {
		return
	}
	e := Event{Kind: kind, Primitive: s.prim, Name: s.name, Token: h.token, Handoff: h.given, Err: err}
	if s.prim == PrimitiveSemaphore {
		e.Permits = h.n
	}
	if kind == EventHoldTaken {
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

// lose closes h's Lost channel and stops its renewal, unless h is no longer
// the value's hold or was lost already.
func (s *holds) lose(h *hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseLocked(h)
}

// loseLocked is lose with s.mu held. A hold that waits to become the
// value's (see take) is marked lost, and tells nothing: it was never
// taken.
func (s *holds) loseLocked(h *hold) {
	if h.isLost || h.cause != nil {
		return
	}
	if s.cur != h {
		h.isLost = true
		close(h.lost)
		s.c.wd.Remove(h.ka)
		return
	}
	h.isLost = true
	// Told before Lost is closed: a caller that closes its Client once
	// Lost is closed still has the event delivered.
	switch {
	case h.given:
		// Handoff tells how it ended once Redis answered (see told).
	case s.c.ctx.Err() != nil: // the Client is closing, and releases it
		s.emit(EventHoldReleased, h, ErrClosed)
	default:
		s.emit(EventHoldLost, h, nil)
	}
	close(h.lost)
	end(h, ErrLockLost)
	s.c.wd.Remove(h.ka)
	if s.onLost != nil {
		s.onLost()
	}
}

// forgetLocked drops h, the value's hold, before its release is sent: no
// renewal may outlive the release. s.mu must be held.
func (s *holds) forgetLocked(h *hold) {
	if h.cause == nil {
		s.emit(EventHoldReleased, h, nil)
	}
	s.forgetUntoldLocked(h)
}

// forgetUntoldLocked is forgetLocked for a hold that lasts until its
// release is sent, and whose end the caller tells once Redis answered it
// (see told): the release may find that Redis no longer had it. s.mu must
// be held.
func (s *holds) forgetUntoldLocked(h *hold) {
	s.c.wd.Remove(h.ka)
	end(h, ErrReleased)
	if s.cur == h {
		s.cur = nil
		close(s.free)
	}
}

// told tells the events queue how h, forgotten untold before its release
// (or its hand-off) was sent, ended: lost when the release found that
// Redis no longer had it (gone), else released. A hold found gone is
// lost: its Lost channel is closed too, if it was not already, so that
// whoever watches it sees the loss the call reports.
func (s *holds) told(h *hold, gone bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gone {
		h.given = false
		s.emit(EventHoldLost, h, nil)
		h.isLost = true
		select {
		case <-h.lost:
		default:
			close(h.lost)
		}
		return
	}
	s.emit(EventHoldReleased, h, nil)
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
// with cause ErrNotHeld at once when the value holds nothing. It carries
// the hold (see holdIn). Its CancelFunc forgets it.
func (s *holds) context(parent context.Context) (context.Context, context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return holdContext(&s.mu, s, s.cur, parent)
}

// holdKey is the key under which a context carries a hold of the value
// owner (the *holds of a Mutex or Semaphore, a *MultiMutex, ...): a
// hold's context does, and so does what is derived from it. A Lock whose
// ctx carries its value's hold re-enters it, and an Unlock with such a
// ctx releases a level of that hold, whatever else the value holds.
type holdKey struct{ owner any }

// holdIn returns the hold of owner that ctx carries, or nil.
func holdIn(ctx context.Context, owner any) *hold {
	h, _ := ctx.Value(holdKey{owner}).(*hold)
	return h
}

// holdContext is holds.context for the hold h (nil: none) of owner,
// guarded by mu, which the caller holds; the CancelFunc takes it.
func holdContext(mu *sync.Mutex, owner any, h *hold, parent context.Context) (context.Context, context.CancelFunc) {
	if h != nil {
		parent = context.WithValue(parent, holdKey{owner}, h)
	}
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

// do takes a hold of owner with acquire (which re-enters the hold that
// ctx carries, if any), runs fn with a context of that hold (see
// holdContext, guarded by mu), and releases the level it took with
// release, even when fn fails or panics (the panic goes on once the
// release returned): it returns fn's error joined with release's. The
// release is of that hold, whatever else the value holds by then.
func do(ctx context.Context, owner any, mu *sync.Mutex, acquire, release func(context.Context) error, fn func(context.Context) error) (err error) {
	slot := &heldSlot{owner: owner}
	if err := acquire(context.WithValue(ctx, heldKey{}, slot)); err != nil {
		return err
	}
	h := slot.h.Load() // the hold acquire took or re-entered
	mu.Lock()
	hctx, cancel := holdContext(mu, owner, h, ctx)
	mu.Unlock()
	defer func() {
		cancel()
		err = errors.Join(err, release(context.WithValue(ctx, holdKey{owner}, h)))
	}()
	return fn(hctx)
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

// lostChan returns the Lost channel of the value's hold, or notHeld.
func (s *holds) lostChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return notHeld
	}
	return s.cur.lost
}

// notHeld is the Lost channel of a value that holds nothing: closed, so
// that work watching it stops rather than run unguarded.
var notHeld = func() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// settle runs release, an idempotent release script call, as
// roundtrip's Settle does: sent even when ctx has ended (a release is due
// whatever ctx says), again while Redis cannot serve it for now, waited for
// with ctx; an abandoned one goes on, and late (if not nil) gets its
// outcome when it returns. It returns the script's reply.
func (c *Client) settle(ctx context.Context, release func(context.Context, redis.UniversalClient) (int64, error), late func(int64, error)) (int64, bool, error) {
	res, abandoned, err := c.rt.Settle(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		res, err := release(ctx, rdb)
		return []int64{res}, err
	}, func(res []int64, err error) {
		if late != nil {
			if err != nil {
				late(0, redisError(err))
				return
			}
			late(res[0], nil)
		}
	})
	if err != nil {
		return 0, abandoned, redisError(err)
	}
	return res[0], false, nil
}

// notConfirmed says that a release failed or was not confirmed in time:
// what it released is no longer renewed, and runs out within its lease.
func notConfirmed(err error) error {
	return unconfirmed(err, "it is no longer renewed, and runs out in Redis within its lease")
}

// unconfirmed is ErrUnconfirmed with its cause and what becomes of what
// the call gave up.
func unconfirmed(cause error, then string) error {
	return &unconfirmedError{cause: cause, then: then}
}

type unconfirmedError struct {
	cause error
	then  string
}

func (e *unconfirmedError) Error() string {
	return e.cause.Error() + " (" + ErrUnconfirmed.Error() + ": " + e.then + ")"
}
func (e *unconfirmedError) Unwrap() []error { return []error{ErrUnconfirmed, e.cause} }
