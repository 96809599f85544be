package redisync

import (
	"cmp"
	"context"
	"sync"

	"github.com/redisync/redisync/internal/schema"
)

// RWMutex is a read-write lock shared by every process that uses the same
// name and key prefix on the same Redis: many readers or one writer.
//
// It is a Semaphore of a fixed, very large size (RWMutexWrite) under
// keys of its own, so that it never shares a key with a Semaphore of the
// same name: a read holds one permit, a write all of them. So it has a
// Semaphore's guarantees. Arrival order is decided in Redis and served
// strictly first come, first served: a writer waits for the readers ahead
// of it, and readers that come after a waiting writer queue behind it, so
// neither readers nor writers starve. The release that ends a write (or
// the last read before a queued writer) grants, in the same script, the
// next writer or the whole run of readers at the head of the queue, one
// message per process; waiters sleep until then, never polling. Every
// reader's share is a holder of its own with its own lease, renewed by
// the Client's watchdog, so a reader that crashes blocks writers for at
// most its lease.
//
// A RWMutex value is one holder, and is safe for concurrent use; its
// levels are counted in the process, without asking Redis: RLock while it
// holds a read or the write, and Lock while it holds the write, only add a
// level. Unlock of its last write level while it still holds read levels
// is a downgrade: the write ends and one read stays, in one script call
// that lets the readers queued at the head in. Lock while it holds only
// reads is an upgrade, which it refuses with ErrUpgrade at once (two
// readers upgrading would wait for each other for good). Since a level is
// added without queueing, goroutines that share a value and keep its reads
// overlapping keep it reading, ahead of a queued writer: fairness is
// between values, so give each goroutine a value of its own.
//
// A write carries a fencing token (Token), minted in Redis by the script
// that grants it, by the same rule as a Mutex's; a read has none.
//
// The options are those of a Semaphore (WithLease, WithWatchdogLease,
// WithHeartbeat, WithRecheck, WithMaxHold, WithLabel, WithKeyPrefix...).
type RWMutex struct {
	s    *Semaphore
	turn turn // held by the call of the value that takes its first level

	mu     sync.Mutex
	reads  int64 // read levels held
	writes int64 // write levels held
}

// NewRWMutex returns a RWMutex called name. It does no I/O. An invalid
// name (ErrInvalidName) or option (ErrInvalidOption) is reported by every
// call of the RWMutex, before any call to Redis.
func (c *Client) NewRWMutex(name string, opts ...SemaphoreOption) *RWMutex {
	cfg := with(c.cfg, opts, SemaphoreOption.applySemaphore)
	s := c.newSemaphore(name, schema.RWMutexSize, cfg, PrimitiveRWMutex, schema.RWMutexKeys(cfg.prefix, name))
	s.fence = true
	return &RWMutex{s: s, turn: newTurn()}
}

// RLock blocks until rw holds a read, ctx ends or the Client is closed. It
// only adds a level when rw holds a read or the write already; otherwise
// it waits behind every request queued before it, writers included.
//
// When ctx ends first, RLock returns ctx.Err() wrapped and leaves nothing
// behind, as Semaphore.Acquire. It returns ErrLockLost when rw's hold was
// lost (release its levels first), ErrClosed after Close, and the errors
// of Redis.
func (rw *RWMutex) RLock(ctx context.Context) error {
	_, err := rw.observed(ctx, OpRLock, false, true)
	return err
}

// TryRLock makes one attempt to take a read and never waits or queues: it
// reports whether rw holds a read now. It fails when anyone is queued
// (a writer waits), and when another call of rw that takes its first
// level is under way.
func (rw *RWMutex) TryRLock(ctx context.Context) (bool, error) {
	return rw.observed(ctx, OpTryRLock, false, false)
}

// Lock blocks until rw holds the write, ctx ends or the Client is closed.
// It only adds a level when rw holds the write already; it returns
// ErrUpgrade at once when rw holds only reads. Otherwise it waits behind
// every request queued before it, and until no other holder is left. Its
// other errors are RLock's.
func (rw *RWMutex) Lock(ctx context.Context) error {
	_, err := rw.observed(ctx, OpLock, true, true)
	return err
}

// TryLock makes one attempt to take the write and never waits or queues:
// it reports whether rw holds the write now. It returns ErrUpgrade when rw
// holds only reads.
func (rw *RWMutex) TryLock(ctx context.Context) (bool, error) {
	return rw.observed(ctx, OpTryLock, true, false)
}

// RUnlock gives back a read level. When it was rw's last level, the
// read's permit is released in Redis, which grants the writer at the head
// of the queue if nobody else reads. It returns ErrNotHeld when rw holds
// no read, and ErrLockLost when rw's hold was lost (the level is dropped
// all the same). The release is sent and confirmed as a Semaphore's
// Release.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	return rw.observedRelease(ctx, OpRUnlock, false)
}

// Unlock gives back a write level. At rw's last write level the write
// ends: the lock goes to the head of the queue, a writer or the run of
// readers there, in the same script; when rw still holds read levels it
// keeps one read (a downgrade). It returns ErrNotHeld when rw holds no
// write; its other errors are RUnlock's.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	return rw.observedRelease(ctx, OpUnlock, true)
}

// Token returns the fencing token of rw's write while it holds one, and 0
// otherwise: a read has no token.
func (rw *RWMutex) Token() int64 {
	rw.mu.Lock()
	w := rw.writes
	rw.mu.Unlock()
	if w == 0 {
		return 0
	}
	return rw.s.token()
}

// Lost returns a channel that is closed when rw's hold, read or write, is
// lost: its lease could not be renewed in time, it was removed behind rw's
// back, its fixed lease ran out, or the Client was closed. Releasing it
// normally does not close it; a downgrade keeps it. When rw holds nothing,
// Lost returns nil (a channel that never delivers).
func (rw *RWMutex) Lost() <-chan struct{} { return rw.s.Lost() }

// HoldContext returns a context, derived from parent, that is cancelled
// the moment rw's hold ends (a downgrade does not end it): context.Cause
// says ErrLockLost when it was lost, ErrReleased when rw gave back its
// last level. When rw holds nothing it is cancelled already, with cause
// ErrNotHeld. Call the CancelFunc when the work is done.
func (rw *RWMutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return rw.s.HoldContext(parent)
}

// Name returns the name of the lock.
func (rw *RWMutex) Name() string { return rw.s.name }

// observed runs acquire, told to the Client's Observer if it has one.
func (rw *RWMutex) observed(ctx context.Context, op Op, write, wait bool) (bool, error) {
	return observedTry(rw.s.c.obs, ctx, rw.call(op), func(ctx context.Context) (bool, error) {
		return rw.acquire(ctx, op, write, wait)
	}, rw.Token)
}

// observedRelease runs release, told to the Client's Observer if it has
// one.
func (rw *RWMutex) observedRelease(ctx context.Context, op Op, write bool) error {
	return observed(rw.s.c.obs, ctx, rw.call(op), func(ctx context.Context) error { return rw.release(ctx, op, write) }, nil)
}

// call describes a call op of rw to an Observer.
func (rw *RWMutex) call(op Op) Call {
	return Call{Op: op, Primitive: PrimitiveRWMutex, Name: rw.s.name}
}

// acquire takes a level, a write or a read, waiting for it or not.
func (rw *RWMutex) acquire(ctx context.Context, op Op, write, wait bool) (bool, error) {
	if err := cmp.Or(rw.s.err, rw.s.c.usable(), ctx.Err()); err != nil {
		return false, rw.wrap(op, err)
	}
	if ok, err := rw.reenter(write); ok || err != nil {
		return ok, rw.wrap(op, err)
	}
	if wait {
		if err := rw.turn.take(ctx, rw.s.c.ctx.Done()); err != nil {
			return false, rw.wrap(op, err)
		}
	} else if !rw.turn.try() {
		return false, nil // a call of rw taking its first level is ahead
	}
	defer rw.turn.give()
	// Another call of rw may have taken a level while this one waited.
	if ok, err := rw.reenter(write); ok || err != nil {
		return ok, rw.wrap(op, err)
	}
	n := int64(1)
	if write {
		n = rw.s.size
	}
	ok, err := true, error(nil)
	if wait {
		err = rw.s.acquire(ctx, n)
	} else {
		ok, err = rw.s.tryAcquire(ctx, n)
	}
	if err != nil || !ok {
		return false, rw.wrap(op, err)
	}
	rw.mu.Lock()
	if write {
		rw.writes = 1
	} else {
		rw.reads = 1
	}
	rw.mu.Unlock()
	return true, nil
}

// reenter adds a level to rw's hold when it has one that allows it. It
// reports whether it did, and fails with ErrUpgrade for a write while rw
// holds only reads, and with ErrLockLost when the hold was lost.
func (rw *RWMutex) reenter(write bool) (bool, error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	switch {
	case rw.reads == 0 && rw.writes == 0:
		return false, nil
	case write && rw.writes == 0:
		return false, ErrUpgrade
	case rw.lost():
		return false, ErrLockLost
	case write:
		rw.writes++
	default:
		rw.reads++
	}
	return true, nil
}

// release gives back a level, a write or a read, and in Redis the permits
// that rw holds no more: all of them at its last level, all but one
// at the end of a write while reads remain.
func (rw *RWMutex) release(ctx context.Context, op Op, write bool) error {
	if rw.s.err != nil {
		return rw.wrap(op, rw.s.err)
	}
	rw.mu.Lock()
	var n int64 // the permits to give back
	switch {
	case write && rw.writes == 0, !write && rw.reads == 0:
		rw.mu.Unlock()
		return rw.wrap(op, ErrNotHeld)
	case write:
		if rw.writes--; rw.writes == 0 {
			n = rw.s.size
			if rw.reads > 0 {
				n-- // a downgrade: one read stays
			}
		}
	default:
		if rw.reads--; rw.reads == 0 && rw.writes == 0 {
			n = 1
		}
	}
	lost := n == 0 && rw.lost()
	rw.mu.Unlock()
	switch {
	case lost:
		return rw.wrap(op, ErrLockLost)
	case n == 0:
		return nil
	}
	return rw.wrap(op, rw.s.releaseN(ctx, n))
}

// lost reports whether rw's hold was lost (or dropped).
func (rw *RWMutex) lost() bool {
	rw.s.mu.Lock()
	defer rw.s.mu.Unlock()
	return rw.s.cur == nil || rw.s.cur.isLost
}

// wrap adds the operation and the lock's name to err, in place of the
// semaphore's operation that failed under it.
func (rw *RWMutex) wrap(op Op, err error) error {
	if err == nil {
		return nil
	}
	if oe, ok := err.(*opError); ok {
		err = oe.err
	}
	return wrapOp(string(op), rw.s.name, err)
}

// RWMutexWrite is the number of permits a write holds, or waits for, in
// the state InspectRWMutex reads; a read holds 1. It is the size of the
// semaphore under a RWMutex.
const RWMutexWrite = schema.RWMutexSize

// InspectRWMutex reads the state of the read-write lock called name, as
// InspectSemaphore reads a semaphore's (a RWMutex is one, see RWMutex): a
// holder or waiter with RWMutexWrite permits is a write, one with 1 a
// read. opts name the keys as for NewRWMutex. A lock never used, or idle
// for an hour, is Empty.
func (c *Client) InspectRWMutex(ctx context.Context, name string, opts ...SemaphoreOption) (*SemaphoreState, error) {
	cfg := with(c.cfg, opts, SemaphoreOption.applySemaphore)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect rwmutex", name, err)
	}
	return c.inspectSemaphore(ctx, name, schema.RWMutexKeys(cfg.prefix, name))
}
