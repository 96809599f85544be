package redisync

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/redisync/redisync/internal/schema"
)

// RWMutex is a read-write lock shared by every process that uses the same
// name and key prefix on the same Redis: many readers or one writer.
//
// A RWMutex value is used as a *sync.RWMutex is: goroutines that share it
// exclude each other as they exclude every other value's holders. Each
// Lock and RLock call is a holder of its own in Redis, with its own place
// in the queue and its own lease, renewed by the Client's watchdog, so a
// reader that crashes blocks writers for at most its lease. Unlock and
// RUnlock may be called from any goroutine, as sync.RWMutex's may.
//
// It is a Semaphore of a fixed, very large size (MaxSemaphoreSize) under keys
// of its own, so that it never shares a key with a Semaphore of the same
// name: a read holds one permit, a write all of them. So it has a
// Semaphore's guarantees. Arrival order is decided in Redis and served
// strictly first come, first served: a writer waits for the readers ahead
// of it, and readers that come after a waiting writer queue behind it, so
// neither readers nor writers starve. The release that ends a write (or
// the last read before a queued writer) grants, in the same script, the
// next writer or the whole run of readers at the head of the queue, one
// message per process; waiters sleep until then, never polling.
//
// It is reentrant through a hold's context, as a Mutex is: a Lock or RLock
// whose ctx comes from the write (Do's function's ctx, HoldContext) adds a
// level to the write (a writer reads too), an RLock whose ctx comes from a
// read (RDo's function's ctx) adds a level to that read, and a Lock whose
// ctx comes from a read fails with ErrUpgrade at once (it would wait for
// its own read for good). Any other call waits its turn, in the goroutine
// that holds too.
//
// A write carries a fencing token (Token), minted in Redis by the script
// that grants it, by the same rule as a Mutex's; a read has none. A hold
// that was lost stays the value's until its last Unlock or RUnlock (which
// returns ErrLockLost): a write of another goroutine of the value waits
// for it, as does a read while a lost write waits for its Unlock, holding
// nothing in Redis meanwhile (TryLock and TryRLock report false).
//
// The options are those of a Semaphore (WithFixedLease, WithCrashTimeout,
// WithWaiterTimeout, WithRecheck, WithMaxHold, WithLabel, WithKeyPrefix...).
//
// Make a RWMutex with Client.NewRWMutex: every call of a zero RWMutex
// fails with ErrInvalid.
type RWMutex struct {
	c    *Client
	name string
	cfg  config
	keys schema.Semaphore

	mu      sync.Mutex
	write   *rwHold       // the value's write, lost or not, until its last Unlock
	reads   []*rwHold     // the value's reads, each until its last RUnlock
	changed chan struct{} // closed, and replaced, when a hold is forgotten
}

// rwHold is one hold of a RWMutex, a write or a read, taken by one Lock or
// RLock call: a holder of its own in Redis (a Semaphore value of its own).
type rwHold struct {
	s      *Semaphore
	write  bool
	scoped bool  // taken by Do or RDo, which release it by its context
	levels int64 // guarded by the RWMutex's mu
}

// NewRWMutex returns a RWMutex called name. It does no I/O. It fails with
// an *OpError wrapping ErrInvalidName or ErrInvalidOption (and ErrInvalid)
// for an invalid name or option.
func (c *Client) NewRWMutex(name string, opts ...Option) (*RWMutex, error) {
	cfg := with(c.cfg, atRWMutex, opts)
	if err := cmp.Or(checkName(name), cfg.err); err != nil {
		return nil, wrapOp("new rwmutex", name, err)
	}
	return &RWMutex{c: c, name: name, cfg: cfg, keys: schema.RWMutexKeys(cfg.prefix, name),
		changed: make(chan struct{})}, nil
}

// RLock blocks until a read is held for this call, ctx ends or the Client
// is closed: behind every request queued before it, writers included.
// When ctx carries a hold of rw (see RWMutex), it adds a level to that
// hold at once instead.
//
// When ctx ends first, RLock returns ctx.Err() wrapped and leaves nothing
// behind, as Semaphore.Acquire. It returns ErrClosed after Close, and the
// errors of Redis.
func (rw *RWMutex) RLock(ctx context.Context) error {
	_, err := rw.observed(ctx, OpRLock, false, true)
	return err
}

// TryRLock makes one attempt to take a read and never waits or queues: it
// reports whether a read is held for this call now. It fails when anyone
// is queued (a writer waits). When ctx carries a hold of rw, it adds a
// level to it, as RLock does.
func (rw *RWMutex) TryRLock(ctx context.Context) (bool, error) {
	return rw.observed(ctx, OpTryRLock, false, false)
}

// Lock blocks until the write is held for this call, ctx ends or the
// Client is closed: behind every request queued before it, and until no
// other holder is left, the value's own readers included. When ctx
// carries rw's write, it adds a level to it at once; when it carries a
// read of rw, Lock returns ErrUpgrade at once. Its other errors are
// RLock's.
func (rw *RWMutex) Lock(ctx context.Context) error {
	_, err := rw.observed(ctx, OpLock, true, true)
	return err
}

// TryLock makes one attempt to take the write and never waits or queues:
// it reports whether the write is held for this call now (false while
// anyone else holds or waits, another goroutine of rw included). ctx is
// treated as Lock treats it.
func (rw *RWMutex) TryLock(ctx context.Context) (bool, error) {
	return rw.observed(ctx, OpTryLock, true, false)
}

// RUnlock gives back a level of a read: of the read that ctx carries, or
// else of one of rw's reads taken by RLock or TryRLock (one that was lost
// first, so that the RUnlock owed to it is paid before any other). At the read's last level its
// permit is released in Redis, which grants the writer at the head of the
// queue if nobody else reads. It returns ErrNotHeld when rw holds no read,
// and ErrLockLost when the read was lost. The release is sent and
// confirmed as a Semaphore's Release. Given a ctx of rw's write, it gives
// back a level of the write, as Unlock does.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	return rw.observedRelease(ctx, OpRUnlock, false)
}

// Unlock gives back a level of rw's write: of the write that ctx carries,
// or else of rw's write, whichever goroutine took it. At its last level
// the write ends: the lock goes to the head of the queue, a writer or the
// run of readers there, in the same script. It returns ErrNotHeld when rw
// holds no write; its other errors are RUnlock's.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	return rw.observedRelease(ctx, OpUnlock, true)
}

// Do takes the write, runs fn with a context of it (see HoldContext), and
// releases it, even when fn fails or panics: it returns fn's error joined
// with Unlock's. When ctx carries rw's write, Do re-enters it. When Lock
// fails, fn does not run and Do returns Lock's error.
func (rw *RWMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return rw.do(ctx, true, fn)
}

// RDo takes a read, runs fn with a context of it (cancelled when the read
// is lost, with cause ErrLockLost; an RLock with it re-enters the read),
// and releases it, even when fn fails or panics: it returns fn's error
// joined with RUnlock's. When RLock fails, fn does not run and RDo returns
// RLock's error.
func (rw *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context) error) error {
	return rw.do(ctx, false, fn)
}

// Token returns the fencing token of rw's write while it holds one, and 0
// otherwise: a read has no token.
func (rw *RWMutex) Token() int64 {
	if w := rw.current(); w != nil {
		return w.s.token()
	}
	return 0
}

// Lost returns a channel that is closed when rw's write is lost: its lease
// could not be renewed in time, it was removed behind rw's back, its fixed
// lease ran out, or the Client was closed. Releasing it normally does not
// close it. When rw holds no write, Lost returns a closed channel: take it
// after Lock succeeds. A read's loss cancels RDo's context.
func (rw *RWMutex) Lost() <-chan struct{} {
	if w := rw.current(); w != nil {
		return w.s.Lost()
	}
	return notHeld
}

// HoldContext returns a context, derived from parent, that is cancelled
// the moment rw's write ends: context.Cause says ErrLockLost when it was
// lost, ErrReleased when it was released. When rw holds no write it is
// cancelled already, with cause ErrNotHeld. It carries the write: a Lock
// or RLock with it re-enters it. Call the CancelFunc when the work is
// done.
func (rw *RWMutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	w := rw.current()
	if w == nil {
		ctx, cancel := context.WithCancelCause(parent)
		cancel(ErrNotHeld)
		return ctx, func() {}
	}
	return rw.context(parent, w)
}

// Name returns the name of the lock.
func (rw *RWMutex) Name() string { return rw.name }

// rwHoldKey is the key under which a context carries a hold of the RWMutex rw.
type rwHoldKey struct{ rw *RWMutex }

// heldIn returns the hold of rw that ctx carries, or nil.
func (rw *RWMutex) heldIn(ctx context.Context) *rwHold {
	h, _ := ctx.Value(rwHoldKey{rw}).(*rwHold)
	return h
}

// context returns a context of h, derived from parent, that carries it.
func (rw *RWMutex) context(parent context.Context, h *rwHold) (context.Context, context.CancelFunc) {
	return h.s.HoldContext(context.WithValue(parent, rwHoldKey{rw}, h))
}

// current returns rw's write, or nil.
func (rw *RWMutex) current() *rwHold {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.write
}

// observed runs take, told to the Client's Observer if it has one.
func (rw *RWMutex) observed(ctx context.Context, op Op, write, wait bool) (bool, error) {
	return observedTry(rw.c.observer(), ctx, rw.call(op), func(ctx context.Context) (bool, error) {
		h, err := rw.take(ctx, op, write, wait, false)
		return h != nil, err
	}, rw.Token)
}

// observedRelease runs release, told to the Client's Observer if it has
// one.
func (rw *RWMutex) observedRelease(ctx context.Context, op Op, write bool) error {
	return observed(rw.c.observer(), ctx, rw.call(op), func(ctx context.Context) error { return rw.release(ctx, op, write) }, nil)
}

// call describes a call op of rw to an Observer.
func (rw *RWMutex) call(op Op) CallInfo {
	return CallInfo{Op: op, Primitive: PrimitiveRWMutex, Name: rw.name}
}

// do takes a hold, a write or a read, runs fn with a context of it, and
// gives it back, even when fn fails or panics.
func (rw *RWMutex) do(ctx context.Context, write bool, fn func(ctx context.Context) error) (err error) {
	op, release := OpRLock, OpRUnlock
	if write {
		op, release = OpLock, OpUnlock
	}
	var h *rwHold
	_, err = observedTry(rw.c.observer(), ctx, rw.call(op), func(ctx context.Context) (bool, error) {
		var err error
		h, err = rw.take(ctx, op, write, true, true)
		return h != nil, err
	}, rw.Token)
	if err != nil {
		return err
	}
	hctx, cancel := rw.context(ctx, h)
	defer func() {
		cancel()
		err = errors.Join(err, rw.observedRelease(context.WithValue(ctx, rwHoldKey{rw}, h), release, write))
	}()
	return fn(hctx)
}

// take takes a level, a write or a read, waiting for it or not (wait), and
// returns the hold it took or re-entered; nil and no error when a try
// found the lock taken. A hold taken for Do or RDo is scoped.
func (rw *RWMutex) take(ctx context.Context, op Op, write, wait, scoped bool) (*rwHold, error) {
	if h := rw.heldIn(ctx); h != nil {
		return rw.reenter(ctx, op, h, write)
	}
	if err := cmp.Or(rw.c.usable(), ctx.Err()); err != nil {
		return nil, rw.wrap(op, err)
	}
	n := int64(1)
	if write {
		n = schema.RWMutexSize
	}
	for {
		// A lost hold of rw in the way: wait for its Unlock holding
		// nothing in Redis (see owedUnlock).
		if err := owedUnlock(ctx, &rw.mu, func() <-chan struct{} { return rw.owed(write) }, rw.c.ctx.Done(), wait); err != nil {
			if errors.Is(err, errBusy) {
				return nil, nil
			}
			return nil, rw.wrap(op, err)
		}
		s := rw.c.newSemaphore(rw.name, schema.RWMutexSize, rw.cfg, PrimitiveRWMutex, rw.keys)
		s.fence = true
		ok, err := true, error(nil)
		if wait {
			err = s.acquire(ctx, n)
		} else {
			ok, err = s.tryAcquire(ctx, n)
		}
		if err != nil || !ok {
			return nil, rw.wrap(op, unwrapOp(err))
		}
		h := &rwHold{s: s, write: write, scoped: scoped, levels: 1}
		err = rw.claim(ctx, h, wait)
		if err == nil {
			return h, nil
		}
		// Not the value's: give it back (and, when it was lost while it
		// waited, take the lock anew).
		_ = s.releaseN(context.WithoutCancel(ctx), n)
		switch {
		case errors.Is(err, errBusy) && !wait:
			return nil, nil
		case errors.Is(err, errBusy): // a lost hold's Unlock is owed: see above
		case !errors.Is(err, ErrLockLost) || !wait:
			return nil, rw.wrap(op, err)
		}
	}
}

// blocker returns a hold of rw that keeps a write (write) or a read out,
// the lost one if there is one, or nil. rw.mu must be held.
func (rw *RWMutex) blocker(write bool) *rwHold {
	var in []*rwHold
	switch {
	case rw.write != nil:
		in = []*rwHold{rw.write}
	case write:
		in = rw.reads
	}
	for _, h := range in {
		if isClosed(h.s.Lost()) {
			return h
		}
	}
	if len(in) > 0 {
		return in[0]
	}
	return nil
}

// owed returns the channel closed when rw's holds change, when a lost
// hold keeps a write (write) or a read out (its Unlock is owed), or nil.
// rw.mu must be held.
func (rw *RWMutex) owed(write bool) <-chan struct{} {
	if b := rw.blocker(write); b != nil && isClosed(b.s.Lost()) {
		return rw.changed
	}
	return nil
}

// claim makes h, just taken in Redis, one of rw's holds. A write waits
// until rw has no other hold, a read until rw has no write: the holds of
// rw found there are gone from Redis (Redis granted h), and are found lost
// soon. It fails with errBusy when one of them is lost (its Unlock is
// owed: the caller gives h back and waits for that Unlock holding
// nothing), or when it would wait and may not; when h is lost while it
// waits, with ErrLockLost.
func (rw *RWMutex) claim(ctx context.Context, h *rwHold, wait bool) error {
	for {
		rw.mu.Lock()
		b := rw.blocker(h.write)
		if b == nil {
			if h.write {
				rw.write = h
			} else {
				rw.reads = append(rw.reads, h)
			}
			rw.mu.Unlock()
			return nil
		}
		changed := rw.changed
		rw.mu.Unlock()
		if !wait || isClosed(b.s.Lost()) {
			return errBusy
		}
		select {
		case <-changed:
		case <-b.s.Lost(): // its Unlock is owed now
		case <-h.s.Lost():
			return ErrLockLost
		case <-ctx.Done():
			return ctx.Err()
		case <-rw.c.ctx.Done():
			return ErrClosed
		}
	}
}

// reenter adds a level to h, a hold of rw that ctx carries, for a call
// that takes a write (write) or a read. A write asked for under a read is
// an upgrade: ErrUpgrade.
func (rw *RWMutex) reenter(ctx context.Context, op Op, h *rwHold, write bool) (*rwHold, error) {
	if write && !h.write {
		return nil, rw.wrap(op, ErrUpgrade)
	}
	if err := rw.c.usable(); err != nil {
		return nil, rw.wrap(op, err)
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if !rw.holds(h) {
		return nil, rw.wrap(op, ErrReleased)
	}
	select {
	case <-h.s.Lost():
		return nil, rw.wrap(op, ErrLockLost)
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, rw.wrap(op, err)
	}
	h.levels++
	return h, nil
}

// holds reports whether h is one of rw's holds. rw.mu must be held.
func (rw *RWMutex) holds(h *rwHold) bool {
	return rw.write == h || slices.Contains(rw.reads, h)
}

// release gives back a level of a hold: the hold ctx carries, or rw's
// write (write), or one of its reads, lost ones first. At its last level
// the hold's permits are released in Redis.
func (rw *RWMutex) release(ctx context.Context, op Op, write bool) error {
	if err := rw.c.made(); err != nil {
		return rw.wrap(op, err)
	}
	rw.mu.Lock()
	h := rw.heldIn(ctx)
	switch {
	case h != nil && !rw.holds(h):
		h = nil // released already
	case h == nil && write:
		h = rw.write
	case h == nil:
		h = rw.anyRead()
	}
	if h == nil || (write && !h.write) {
		rw.mu.Unlock()
		return rw.wrap(op, ErrNotHeld)
	}
	if h.levels--; h.levels > 0 {
		rw.mu.Unlock()
		if isClosed(h.s.Lost()) {
			return rw.wrap(op, ErrLockLost)
		}
		return nil
	}
	if h.write {
		rw.write = nil
	} else {
		rw.reads = slices.DeleteFunc(rw.reads, func(r *rwHold) bool { return r == h })
	}
	close(rw.changed)
	rw.changed = make(chan struct{})
	rw.mu.Unlock()
	n := int64(1)
	if h.write {
		n = schema.RWMutexSize
	}
	return rw.wrap(op, unwrapOp(h.s.releaseN(ctx, n)))
}

// anyRead returns the read an RUnlock without a hold's context releases:
// one that an RLock or TryRLock took (RDo releases its own), a lost one
// first, so that the RUnlock owed to it is paid before any other; nil
// when there is none. rw.mu must be held.
func (rw *RWMutex) anyRead() *rwHold {
	var h *rwHold
	for _, r := range rw.reads {
		switch {
		case r.scoped:
		case isClosed(r.s.Lost()):
			return r
		default:
			h = r
		}
	}
	return h
}

// isClosed reports whether c is closed.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// unwrapOp returns what an OpError wraps, or err.
func unwrapOp(err error) error {
	if oe, ok := err.(*OpError); ok {
		return oe.Err
	}
	return err
}

// wrap adds the operation and the lock's name to err.
func (rw *RWMutex) wrap(op Op, err error) error {
	if err == nil {
		return nil
	}
	return wrapOp(string(op), rw.name, err)
}

// rwMutexWrite is the number of permits a write holds, or waits for, in
// the semaphore under a RWMutex: all of them. A read holds 1.
const rwMutexWrite = schema.RWMutexSize
