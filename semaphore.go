package redisync

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/schema"
)

// Semaphore is a counting semaphore of a size stored in Redis, shared by every process
// that uses the same name and key prefix on the same Redis. Permits are
// leased to holders, so the permits of a holder whose process dies come
// back when its lease runs out.
//
// A Semaphore value is one holder, and is safe for concurrent use, like a
// golang.org/x/sync/semaphore.Weighted shared by goroutines: the permits
// acquired through it add up, and Release(n) gives back n of them.
// Values created by NewSemaphore, in one process or many, compete.
//
// Waiters are served first come, first served across all processes: a
// request for n permits is not overtaken by later requests, even smaller
// ones that would fit, so large requests are not starved. (Concurrent
// Acquire calls on one value queue one at a time, in the order they came.)
// Freed permits go, inside the releasing script, to as many waiters at the
// head of the queue as they cover; each is told by a message and returns
// without asking Redis again.
//
// While permits are held their lease is renewed by the Client's watchdog
// (unless WithFixedLease fixed it), and Lost tells when they are lost.
//
// The options work as for a Mutex (WithMaxHold caps how long a holding is
// renewed, from when the value went from no permits to some, however many
// Acquires and Releases follow): WithFixedLease gives permits a fixed lease
// (re-armed by every Acquire and partial Release of the holder) and
// WithCrashTimeout sets the renewed one; WithWaiterTimeout sets how long a
// queued waiter stays queued without a heartbeat, and the lease of permits
// granted to a waiter until its watchdog extends them; WithRecheck bounds
// every sleep. A Semaphore is always fair; Barging is no option of it.
//
// The guarantees and their limits are those of a Mutex: a holder that
// pauses longer than its lease, a failover that loses writes or a clock
// jump on the server can let more holders in than the size.
//
// Make a Semaphore with Client.NewSemaphore: every call of a zero
// Semaphore fails with ErrInvalid.
type Semaphore struct {
	c    *Client
	name string
	size atomic.Int64 // the size last seen in Redis, or the one given
	cfg  config
	keys schema.Semaphore
	// fence is set on a RWMutex's semaphore: a grant of all its permits
	// (a write) carries a fencing token, kept in the hold.
	fence bool

	turn turn // held by the Acquire or TryAcquire of this value under way
	op   turn // held by the call of this value that talks to Redis

	seq   int64 // number of the last script call; guarded by op
	calls int64 // number of the last Acquire; guarded by turn
	// queuedAs is the waiter id that the last attempt of an Acquire sent,
	// which may be queued; guarded by op. A release that ends the holding
	// the call adds to tells Redis, so that a grant to the call that
	// revives the holding's id counts every call of the old holding as
	// applied (a stale copy of one of them changes nothing).
	queuedAs string

	holds // n: the permits held
}

// MaxSemaphoreSize is the largest size a Semaphore can have: its scripts
// count permits in Lua, which writes a number of 10^14 or more in
// exponent notation.
const MaxSemaphoreSize = 1 << 40 // 1,099,511,627,776

// NewSemaphore returns a Semaphore with size permits called name. It does
// no I/O. It fails with an *OpError wrapping ErrInvalidName for an invalid
// name, ErrInvalidPermits for a size outside [1, MaxSemaphoreSize] and
// ErrInvalidOption for an invalid option (each wraps ErrInvalid too).
//
// size is the size the semaphore is created with: the first Acquire or
// TryAcquire that finds no size stored in Redis stores it. When Redis
// stores another size (given by another value, or set by
// Client.ResizeSemaphore), s works with the stored one, and Size reports
// it. The size is kept while the semaphore is in use and for an hour after
// its last Acquire; change it with Client.ResizeSemaphore.
func (c *Client) NewSemaphore(name string, size int64, opts ...Option) (*Semaphore, error) {
	cfg := with(c.cfg, atSemaphore, opts)
	if err := cmp.Or(checkName(name), checkSize(size), cfg.err); err != nil {
		return nil, wrapOp("new semaphore", name, err)
	}
	return c.newSemaphore(name, size, cfg, PrimitiveSemaphore, schema.SemaphoreKeys(cfg.prefix, name)), nil
}

// checkSize reports a semaphore size outside [1, MaxSemaphoreSize].
func checkSize(size int64) error {
	if size <= 0 || size > MaxSemaphoreSize {
		return fmt.Errorf("%w: size %d is outside [1, %d]", ErrInvalidPermits, size, int64(MaxSemaphoreSize))
	}
	return nil
}

// newSemaphore returns a Semaphore of the kind prim (a Semaphore's or a
// RWMutex's) whose keys are keys.
func (c *Client) newSemaphore(name string, size int64, cfg config, prim Primitive, keys schema.Semaphore) *Semaphore {
	s := &Semaphore{
		c:     c,
		name:  name,
		cfg:   cfg,
		turn:  newTurn(),
		op:    newTurn(),
		holds: newHolds(c, prim, name),
		keys:  keys,
	}
	s.size.Store(size)
	return s
}

// Acquire blocks until s holds n more permits, ctx ends or the Client is
// closed. It waits behind every request queued before it.
//
// A waiter sleeps until a message says permits were granted to it, and in
// any case no longer than the time until the earliest lease of a holder
// ends or the recheck interval (WithRecheck), so no wait depends on a
// message arriving. When ctx ends first, Acquire returns ctx.Err()
// wrapped within 25 ms, whatever the go-redis client's
// timeouts, and leaves nothing behind: no permits (a grant that landed at
// that instant is given back and passed on), no place in the queue
// (clean-up still under way then goes on in the background; Close waits
// for it).
//
// Acquire returns ErrInvalidPermits when n is less than 1 (before any
// call to Redis) or more than the size stored in Redis (before Redis
// changes anything), ErrLockLost
// when s's permits have been lost (Release them first: unlike a Mutex's
// lost hold, they are not dropped by the next Acquire, since the
// goroutines that share s may still owe Releases of them, which would
// then give back permits of the new holding), ErrClosed after Close, and
// the errors of Redis. An error reaching Redis on the first
// attempt is returned at once; once Acquire is waiting, it outlives Redis
// being unreachable or failing over, looking again with a growing pause
// until ctx ends.
func (s *Semaphore) Acquire(ctx context.Context, n int64) error {
	return observed(s.c.observer(), ctx, CallInfo{Op: OpAcquire, Primitive: PrimitiveSemaphore, Name: s.name, Permits: n}, func(ctx context.Context) error { return s.acquire(ctx, n) }, nil)
}

// acquire is Acquire, unobserved.
func (s *Semaphore) acquire(ctx context.Context, n int64) error {
	if err := s.usable(ctx, n); err != nil {
		return s.wrap("acquire", err)
	}
	leave, err := s.c.enter(ctx, s.keys.GrantChannel(s.c.id))
	if err != nil {
		return s.wrap("acquire", err)
	}
	defer leave()
	ctx, stop := roundtrip.Marked(ctx)
	defer stop()
	if err := s.turn.take(ctx, s.c.ctx.Done()); err != nil {
		return s.wrap("acquire", err)
	}
	defer s.turn.give()
	a := s.newCall(n, "queue")
	if err := block(ctx, []post{{sub: s.c.sub, channel: s.keys.GrantChannel(s.c.id)}}, a); err != nil {
		return s.wrap("acquire", err)
	}
	return nil
}

// TryAcquire takes n permits if it can now, and never waits or queues:
// it reports whether s holds n more permits now. It fails when anyone is
// queued, even if the free permits would cover n, and when another
// Acquire of s is under way. Leases that ended (their holders gone) are
// reclaimed on the way, in as many calls as that takes.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (bool, error) {
	return observedTry(s.c.observer(), ctx, CallInfo{Op: OpTryAcquire, Primitive: PrimitiveSemaphore, Name: s.name, Permits: n}, func(ctx context.Context) (bool, error) { return s.tryAcquire(ctx, n) }, nil)
}

// tryAcquire is TryAcquire, unobserved.
func (s *Semaphore) tryAcquire(ctx context.Context, n int64) (bool, error) {
	if err := s.usable(ctx, n); err != nil {
		return false, s.wrap("tryacquire", err)
	}
	leave, err := s.c.enter(ctx, s.keys.GrantChannel(s.c.id))
	if err != nil {
		return false, s.wrap("tryacquire", err)
	}
	defer leave()
	ctx, stop := roundtrip.Marked(ctx)
	defer stop()
	if !s.turn.try() {
		return false, nil // an Acquire of s is ahead
	}
	defer s.turn.give()
	a := s.newCall(n, "try")
	for {
		// Attempted again only while the script stopped at a bound:
		// after a stall that ended more leases than one call reclaims,
		// each call reclaims its share of them.
		ok, _, err := a.attempt(ctx)
		if err != nil {
			a.finish(ctx, err)
			return false, s.wrap("tryacquire", err)
		}
		if ok || !a.more {
			return ok, nil
		}
	}
}

// Release gives back n of the permits s holds; they go to the waiters at
// the head of the queue that they cover. It returns ErrTooManyReleased
// (and releases nothing) when s holds fewer than n permits, and
// ErrLockLost when s's permits had been lost, in which case s forgets n of
// them. It never touches another holder's permits.
//
// The release is sent even when ctx has ended already (as after a deferred
// Release of a call that timed out), with a timeout of its own, and sent
// again while the reply is lost (it is idempotent). When s gives back its
// last permits, it forgets them before the release is sent: they are no
// longer renewed, so when the release fails, or ctx ends before it is
// confirmed, Redis frees them within one lease; the error says so. When a
// release of some of s's permits fails, s cannot tell whether Redis
// applied it, so it gives up its holding (Lost is closed) rather than
// renew permits it cannot count. When ctx ends before such a release is
// confirmed, Release returns and its outcome is applied when it comes.
func (s *Semaphore) Release(ctx context.Context, n int64) error {
	return observed(s.c.observer(), ctx, CallInfo{Op: OpRelease, Primitive: PrimitiveSemaphore, Name: s.name, Permits: n}, func(ctx context.Context) error { return s.releaseN(ctx, n) }, nil)
}

// releaseN is Release, unobserved.
func (s *Semaphore) releaseN(ctx context.Context, n int64) error {
	if err := cmp.Or(s.c.made(), s.check(n)); err != nil {
		return s.wrap("release", err)
	}
	// s's turn to talk to Redis is waited for whatever ctx says: a
	// release is due, and the turn is held for one call at a time.
	turn, cancelTurn := roundtrip.Detached(ctx)
	err := s.lockOp(turn)
	cancelTurn()
	if err != nil {
		return s.wrap("release", err)
	}
	wait, cancel := roundtrip.Releasing(ctx)
	defer cancel()

	s.mu.Lock()
	h := s.cur
	var held int64
	if h != nil {
		held = h.n
	}
	switch {
	case n > held:
		s.mu.Unlock()
		s.end()
		err := fmt.Errorf("%w: releasing %d, holding %d", ErrTooManyReleased, n, held)
		if held == 0 {
			err = notHeldToo(err)
		}
		return s.wrap("release", err)
	case h.isLost:
		s.dropLocked(h, n)
		s.mu.Unlock()
		// Nothing left to protect; give the permits back if Redis
		// still counts them (Close racing this call does not see them
		// any more), so that they are free sooner. They are never added
		// to again: a new holding has a new id.
		s.seq++
		seq := s.seq
		s.c.rt.Cleanup(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
			defer s.end()
			_, err := s.release(ctx, rdb, h.id, seq, n, 0, "release", "", h.refuse)
			return nil, err
		})
		if s.c.usable() != nil {
			return s.wrap("release", ErrClosed) // lost with the Client
		}
		return s.wrap("release", ErrLockLost)
	case n == held:
		// Before the release: no renewal may outlive it. How it ended
		// is told once Redis answered (settled).
		s.forgetUntoldLocked(h)
	}
	s.mu.Unlock()

	s.seq++
	seq, waiter := s.seq, s.queuedAs
	sent := time.Now()
	res, abandoned, err := s.c.settle(wait, func(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
		return s.release(ctx, rdb, h.id, seq, n, held, "release", waiter, h.refuse)
	}, func(res int64, err error) {
		_ = s.settled(h, n, held, sent, res, err)
		s.end()
	})
	if abandoned {
		return s.wrap("release", unconfirmed(err, "it goes on in the background"))
	}
	// The value's count changes before its turn to talk to Redis passes
	// on: the next call must send what Redis now counts.
	err = s.settled(h, n, held, sent, res, err)
	s.end()
	if err != nil {
		return s.wrap("release", err)
	}
	return nil
}

// settled applies the outcome of a release of n of the permits of h, of
// which s held held, sent at sent, and returns what Release reports.
func (s *Semaphore) settled(h *hold, n, held int64, sent time.Time, res int64, err error) error {
	switch {
	case err == nil && res < 0:
		if n == held {
			s.told(h, true) // found gone: lost, not released
		}
		s.lose(h)
		s.drop(h, n)
		return ErrLockLost
	case err == nil && n < held:
		s.drop(h, n)
		s.c.wd.Rearm(h.ka, sent)
	case err == nil:
		s.told(h, false)
		s.mu.Lock()
		h.freed = true
		s.mu.Unlock()
	case n == held:
		s.told(h, false)
		return notConfirmed(err)
	default:
		// It may have run or not (even an error reply may answer
		// go-redis's retry of a copy that ran): Redis counts n permits
		// more than s, or not. Renewing them with the rest would keep
		// them for good.
		s.lose(h)
		s.drop(h, n)
		return unconfirmed(err, "the holding is given up, Lost is closed, and its permits run out in Redis within their lease")
	}
	return nil
}

// Held returns the number of permits s holds, as far as s knows (permits
// granted to an Acquire still under way are not counted yet).
func (s *Semaphore) Held() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.n
}

// Lost returns a channel that is closed when s's permits are lost: their
// lease could not be renewed in time, they were removed behind s's back,
// their fixed lease ran out, or the Client was closed. Releasing them
// normally does not close it; a Release that finds them gone from Redis
// closes it before it returns ErrLockLost. When s holds nothing, Lost
// returns a closed channel: take it after Acquire succeeds.
func (s *Semaphore) Lost() <-chan struct{} { return s.lostChan() }

// Name returns the name of the semaphore.
func (s *Semaphore) Name() string { return s.name }

// HoldContext returns a context, derived from parent, that is cancelled
// the moment s's current holding ends: context.Cause says ErrLockLost when
// its permits were lost, ErrReleased when s gave back the last of them.
// When s holds nothing it is cancelled already, with cause ErrNotHeld. Call
// the CancelFunc when the work is done.
func (s *Semaphore) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return s.context(parent)
}

// Do acquires n permits, runs fn with s's HoldContext, and releases the n
// permits, even when fn fails or the permits are lost: it returns fn's
// error joined with Release's. When Acquire fails, fn does not run and Do
// returns Acquire's error.
func (s *Semaphore) Do(ctx context.Context, n int64, fn func(ctx context.Context) error) error {
	acquire := func(ctx context.Context) error { return s.Acquire(ctx, n) }
	release := func(ctx context.Context) error { return s.Release(ctx, n) }
	return do(ctx, &s.holds, &s.mu, acquire, release, fn)
}

// Size returns the number of permits of the semaphore as last seen in
// Redis: the size given to NewSemaphore until an Acquire or TryAcquire of
// s reaches Redis, then the size stored there at its last such call. A
// Client.ResizeSemaphore shows in Size from the next Acquire or
// TryAcquire of s on. (Of two calls of s under way at once, the one whose
// reply comes last sets it, which may be the older size.)
func (s *Semaphore) Size() int64 { return s.size.Load() }

// holdID returns the id of s's holding, or "".
func (s *Semaphore) holdID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return ""
	}
	return s.cur.id
}

// heldBy returns the permits s knows holder to hold. s.mu must be held.
func (s *Semaphore) heldBy(holder string) int64 {
	if s.cur == nil || s.cur.id != holder {
		return 0
	}
	return s.cur.n
}

// withdraw withdraws the waiter, a call for n permits of holder, giving
// back what was granted to it but not taken by s. s.op must be held.
func (s *Semaphore) withdraw(ctx context.Context, rdb redis.UniversalClient, holder string, n int64, waiter string) {
	ctx, cancel := roundtrip.Detached(ctx)
	defer cancel()
	s.mu.Lock()
	held := s.heldBy(holder)
	s.mu.Unlock()
	s.seq++
	_, _ = s.release(ctx, rdb, holder, s.seq, n, held, "withdraw", waiter, false)
}

// release runs the release script for holder as call number seq; refuse
// says that a call of the holding may still be on its way (hold.refuse).
// s.op must be held.
func (s *Semaphore) release(ctx context.Context, rdb redis.UniversalClient, holder string, seq, n, held int64, mode, waiter string, refuse bool) (int64, error) {
	release := semReleaseArgs{holder: holder, n: n, held: held, seq: seq, mode: mode, waiter: waiter,
		lease: s.cfg.holdLease(), size: s.Size(), publish: s.c.publish, fence: s.fence, refuse: refuse || s.c.rt.MayCopy()}
	res, err := release.call(s.keys).run(ctx, rdb).Int64()
	if err != nil {
		return 0, redisError(err)
	}
	return res, nil
}

// releaseAll gives back every permit of h in Redis, for Close.
func (s *Semaphore) releaseAll(ctx context.Context, h *hold) error {
	if err := s.lockOp(ctx); err != nil {
		return s.wrap("close", unconfirmed(err, "the permits run out in Redis within their lease"))
	}
	defer s.end()
	s.mu.Lock()
	n := h.n
	s.mu.Unlock()
	if n > 0 {
		s.seq++
		if _, err := s.release(ctx, s.c.rdb, h.id, s.seq, n, n, "release", "", h.refuse); err != nil {
			return s.wrap("close", unconfirmed(err, "the permits run out in Redis within their lease"))
		}
	}
	return nil
}

// drop forgets n of the permits of h.
func (s *Semaphore) drop(h *hold, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(h, n)
}

// dropLocked is drop with s.mu held: at zero, s forgets h.
func (s *Semaphore) dropLocked(h *hold, n int64) {
	if h.n -= n; h.n <= 0 {
		s.forgetLocked(h)
	}
}

// check validates a number of permits, before any call to Redis: a
// number more than the size stored in Redis is refused by the acquire
// script, and one more than s holds by Release.
func (s *Semaphore) check(n int64) error {
	if n <= 0 || n > MaxSemaphoreSize {
		return fmt.Errorf("%w: %d is outside [1, %d]", ErrInvalidPermits, n, int64(MaxSemaphoreSize))
	}
	return nil
}

// usable checks, before any call to Redis, that s can be used now for n
// permits.
func (s *Semaphore) usable(ctx context.Context, n int64) error {
	return cmp.Or(s.c.made(), s.check(n), s.c.usable(), ctx.Err())
}

// lockOp waits for s's turn to talk to Redis, for a clean-up or a release:
// even after Close.
func (s *Semaphore) lockOp(ctx context.Context) error {
	return s.op.take(ctx, nil)
}

// end gives back s's turn to talk to Redis.
func (s *Semaphore) end() { s.op.give() }

// sleepFor is how long a waiter sleeps, at most, after an attempt found
// the earliest lease ending in next ms (-1: no holder).
func (s *Semaphore) sleepFor(next int64) time.Duration {
	if next < 0 {
		return s.cfg.recheck
	}
	return min(max(time.Duration(next)*time.Millisecond, time.Millisecond), s.cfg.recheck)
}

// wrap adds the operation and the semaphore's name to err.
func (s *Semaphore) wrap(op string, err error) error {
	return wrapOp(op, s.name, err)
}

// turn lets one call of a value at a time go ahead (talk to Redis, take a
// first level, run a campaign): a channel with one slot, held by the call
// whose turn it is.
type turn chan struct{}

// newTurn returns a free turn.
func newTurn() turn { return make(turn, 1) }

// take waits for the turn, the end of ctx, or closed (nil: never), which
// fails it with ErrClosed.
func (t turn) take(ctx context.Context, closed <-chan struct{}) error {
	select {
	case t <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	}
}

// try takes the turn if it is free, without waiting.
func (t turn) try() bool {
	select {
	case t <- struct{}{}:
		return true
	default:
		return false
	}
}

// give gives the turn back.
func (t turn) give() { <-t }
