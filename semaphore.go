package redisync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Semaphore is a counting semaphore of a fixed size shared by every process
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
// (unless WithLease fixed it), and Lost tells when they are lost.
//
// The options work as for a Mutex: WithLease gives permits a fixed lease
// (re-armed by every Acquire and Release of the holder) and
// WithWatchdogLease sets the renewed one; WithHeartbeat sets how long a
// queued waiter stays queued without a heartbeat, and the lease of permits
// granted to a waiter until its watchdog extends them; WithRecheck bounds
// every sleep. Fair makes no difference: a Semaphore is always fair.
//
// The guarantees and their limits are those of a Mutex: a holder that
// pauses longer than its lease, a failover that loses writes or a clock
// jump on the server can let more holders in than the size.
type Semaphore struct {
	c       *Client
	name    string
	size    int64
	cfg     config
	owner   string   // holder id
	keys    []string // holders, expiry, size, queue, waiters, released
	channel string
	err     error // invalid name, size or option

	turn chan struct{} // held by the Acquire of this value that may queue
	op   chan struct{} // held by the call of this value that talks to Redis

	seq   int64 // number of the last script call; guarded by op
	calls int64 // number of the last Acquire; guarded by turn

	mu     sync.Mutex // guards the fields below
	held   int64
	lost   chan struct{} // of the current holding; closed when it is lost
	isLost bool
	ka     *keepalive // the current holding's watchdog entry
}

// NewSemaphore returns a Semaphore with size permits called name. It does
// no I/O. An empty or too long name (ErrInvalidName), a size that is not
// positive (ErrInvalidPermits) or an invalid option (ErrInvalidOption) is
// reported by every call of the Semaphore, before any call to Redis.
//
// The first call to Redis stores the size; a Semaphore of the same name
// with another size fails with ErrSizeMismatch. The size is stored without
// a TTL (like a Mutex's token counter): to change it, stop every user and
// delete the key "<prefix>:sem:{name}:size".
func (c *Client) NewSemaphore(name string, size int64, opts ...Option) *Semaphore {
	cfg := c.cfg.with(opts)
	var bad error
	if size <= 0 {
		bad = fmt.Errorf("%w: size %d is not positive", ErrInvalidPermits, size)
	}
	s := &Semaphore{
		c:     c,
		name:  name,
		size:  size,
		cfg:   cfg,
		owner: c.newOwner(),
		turn:  make(chan struct{}, 1),
		op:    make(chan struct{}, 1),
		err:   cmp.Or(checkName(name), bad, cfg.err),
	}
	base := cfg.prefix + ":sem:{" + name + "}"
	s.keys = []string{base, base + ":expiry", base + ":size", base + ":queue", base + ":waiters", base + ":released"}
	s.channel = base + ":ch"
	return s
}

// Acquire blocks until s holds n more permits, ctx ends or the Client is
// closed. It waits behind every request queued before it.
//
// A waiter sleeps until a message says permits were granted to it, and in
// any case no longer than the time until the earliest lease of a holder
// ends or the recheck interval (WithRecheck), so no wait depends on a
// message arriving. When ctx ends first, Acquire returns ctx.Err()
// wrapped and leaves nothing behind: no permits (a grant that landed at
// that instant is given back and passed on), no place in the queue.
//
// Acquire returns ErrInvalidPermits when n is not in [1, Size()],
// ErrSizeMismatch when Redis has another size for the name, ErrLockLost
// when s's permits have been lost (Release them first), ErrClosed after
// Close, and the errors of Redis. An error reaching Redis on the first
// attempt is returned at once; once Acquire is waiting, it outlives Redis
// being unreachable or failing over, looking again with a growing pause
// until ctx ends.
func (s *Semaphore) Acquire(ctx context.Context, n int64) error {
	if err := s.check(n); err != nil {
		return s.wrap("acquire", err)
	}
	if err := s.take(ctx, s.turn); err != nil {
		return s.wrap("acquire", err)
	}
	defer func() { <-s.turn }()
	s.calls++
	a := &acquireCall{s: s, n: n, waiter: s.owner + "#" + strconv.FormatInt(s.calls, 10)}
	if err := s.c.block(ctx, s.channel, a.waiter, s.cfg.recheck, a); err != nil {
		return s.wrap("acquire", err)
	}
	return nil
}

// TryAcquire makes one attempt to take n permits and never waits or
// queues: it reports whether s holds n more permits now. It fails when
// anyone is queued, even if the free permits would cover n, and when
// another Acquire of s is under way.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (bool, error) {
	if err := cmp.Or(s.check(n), s.c.usable(), ctx.Err()); err != nil {
		return false, s.wrap("tryacquire", err)
	}
	select {
	case s.turn <- struct{}{}:
		defer func() { <-s.turn }()
	default:
		return false, nil // an Acquire of s is ahead
	}
	granted, _, err := s.attempt(ctx, n, "try", "", false)
	if err != nil {
		return false, s.wrap("tryacquire", err)
	}
	return granted, nil
}

// Release gives back n of the permits s holds; they go to the waiters at
// the head of the queue that they cover. It returns ErrTooManyReleased
// (and releases nothing) when s holds fewer than n permits, and
// ErrLockLost when s's permits had been lost, in which case s forgets n of
// them. It never touches another holder's permits.
//
// When the reply is lost, Release sends the same call again (it is
// idempotent) to learn whether it was applied, even when ctx has ended.
// When that fails too, the release of s's last permits is taken as done:
// s forgets them and their lease, no longer renewed, frees them in Redis.
func (s *Semaphore) Release(ctx context.Context, n int64) error {
	if err := s.check(n); err != nil {
		return s.wrap("release", err)
	}
	if err := s.begin(ctx); err != nil {
		return s.wrap("release", err)
	}
	defer s.end()

	s.mu.Lock()
	held, lost, ka := s.held, s.isLost, s.ka
	s.mu.Unlock()
	switch {
	case n > held:
		return s.wrap("release", fmt.Errorf("%w: releasing %d, holding %d", ErrTooManyReleased, n, held))
	case lost:
		s.drop(n)
		return s.wrap("release", ErrLockLost)
	case n == held:
		s.c.wd.remove(ka) // before the release: no renewal may outlive it
	}
	sent := time.Now()
	s.seq++
	// The release is idempotent (its number tells): one that cannot reach
	// Redis for now (a failover under way) is sent again for a while.
	var res int64
	err := s.c.persist(ctx, func() (err error) {
		res, err = s.release(ctx, s.seq, n, held, "release", "")
		return err
	})
	if err != nil && !isReply(err) {
		// The reply was lost (or ctx ended with the call in flight): the
		// same call again, idempotent by its number, tells what happened.
		dctx, cancel := detached(ctx)
		res, err = s.release(dctx, s.seq, n, held, "release", "")
		cancel()
	}
	switch {
	case err != nil:
		if n == held {
			s.drop(n)
		}
		return s.wrap("release", err)
	case res < 0:
		s.markLost(ka)
		s.drop(n)
		return s.wrap("release", ErrLockLost)
	}
	s.drop(n)
	if n < held {
		s.c.wd.rearm(ka, sent)
	}
	return nil
}

// Held returns the number of permits s holds, as far as s knows (permits
// granted to an Acquire still under way are not counted yet).
func (s *Semaphore) Held() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Lost returns a channel that is closed when s's permits are lost: their
// lease could not be renewed in time, they were removed behind s's back,
// their fixed lease ran out, or the Client was closed. Releasing them
// normally does not close it. When s holds nothing, Lost returns nil (a
// channel that never delivers).
func (s *Semaphore) Lost() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost
}

// Name returns the name of the semaphore.
func (s *Semaphore) Name() string { return s.name }

// Size returns the number of permits of the semaphore.
func (s *Semaphore) Size() int64 { return s.size }

// acquireCall is one Semaphore.Acquire call as a contender.
type acquireCall struct {
	s *Semaphore
	n int64
	// waiter is the call's id in the queue and on the channel:
	// "holder#number", one per Acquire, so that a message granting an
	// earlier call is never taken for this one.
	waiter  string
	inQueue bool // an attempt has queued it
}

func (a *acquireCall) attempt(ctx context.Context) (bool, time.Duration, error) {
	granted, next, err := a.s.attempt(ctx, a.n, "queue", a.waiter, a.inQueue)
	if err != nil {
		a.withdraw(ctx) // a failed attempt leaves no place in the queue
		return false, 0, err
	}
	if granted {
		return true, 0, nil
	}
	a.inQueue = true
	return false, a.s.sleepFor(next), nil
}

func (a *acquireCall) queued(w *waiter) *keepalive {
	return a.s.heartbeat(a.waiter, w)
}

func (a *acquireCall) adopt(ctx context.Context, grant string, received time.Time) (bool, error) {
	i := strings.LastIndexByte(grant, ':')
	n, err := strconv.ParseInt(grant[i+1:], 10, 64)
	if err != nil || grant[:i] != a.waiter || n != a.n || a.s.cfg.replicas > 0 {
		// Not a grant of this call, or one to confirm with the
		// replicas: the attempt will tell, and take it if it is ours.
		return false, nil
	}
	if err := a.s.begin(ctx); err != nil {
		a.withdraw(ctx) // gives the permits back
		return false, err
	}
	defer a.s.end()
	a.s.hold(n, received, a.s.grantLease())
	return true, nil
}

func (a *acquireCall) withdraw(ctx context.Context) {
	if a.inQueue {
		a.s.undo(ctx, a.n, a.waiter)
	}
}

// attempt runs the acquire script once for n permits, in mode "queue" (as
// the waiter whose id is given; queued: it has queued before) or "try".
// It reports whether s holds n more permits now and, when not, the
// script's time until the earliest lease ends, in ms.
func (s *Semaphore) attempt(ctx context.Context, n int64, mode, waiter string, queued bool) (bool, int64, error) {
	if err := s.begin(ctx); err != nil {
		return false, 0, err
	}
	defer s.end()

	s.mu.Lock()
	held, lost := s.held, s.isLost
	s.mu.Unlock()
	if lost {
		return false, 0, ErrLockLost
	}
	again := "0"
	if queued {
		again = "1"
	}
	s.seq++
	sent := time.Now()
	res, err := s.c.runAcked(ctx, s.cfg, semAcquireScript, s.keys[:5], []any{
		s.owner, n, s.size, held, s.seq, s.lease().Milliseconds(), mode, waiter, again,
		s.cfg.heartbeat.Milliseconds(), s.grantLease().Milliseconds(),
		s.channel, s.c.publish}, granted)
	if err != nil {
		if mayHaveRun(err) {
			// The script may have run and only its reply was lost.
			s.undoLocked(ctx, n, waiter)
		}
		return false, 0, redisError(err)
	}
	switch res[0] {
	case 1:
		s.hold(n, sent, s.lease())
		return true, 0, nil
	case -1:
		s.markLost(nil)
		return false, 0, ErrLockLost
	case -2:
		return false, 0, fmt.Errorf("%w: size %d, stored size %d", ErrSizeMismatch, s.size, res[1])
	}
	return false, res[1], nil
}

// undo withdraws the waiter (if any) and gives back n permits granted to
// it, or by an acquire sent with the current hold whose reply was lost. It
// outlives ctx.
func (s *Semaphore) undo(ctx context.Context, n int64, waiter string) {
	ctx, cancel := detached(ctx)
	defer cancel()
	select { // even after Close: the clean-up is due
	case s.op <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer s.end()
	s.undoLocked(ctx, n, waiter)
}

// undoLocked is undo with s.op held.
func (s *Semaphore) undoLocked(ctx context.Context, n int64, waiter string) {
	ctx, cancel := detached(ctx)
	defer cancel()
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	s.seq++
	_, _ = s.release(ctx, s.seq, n, held, "withdraw", waiter)
}

// release runs the release script as call number seq. s.op must be held.
func (s *Semaphore) release(ctx context.Context, seq, n, held int64, mode, waiter string) (int64, error) {
	res, err := semReleaseScript.Run(ctx, s.c.rdb, []string{s.keys[0], s.keys[1], s.keys[3], s.keys[4], s.keys[5]},
		s.owner, n, held, seq, mode, waiter, s.lease().Milliseconds(), s.size,
		tombstoneTTL.Milliseconds(), s.channel, s.c.publish).Int64()
	if err != nil {
		return 0, redisError(err)
	}
	return res, nil
}

// hold records n permits acquired. The first ones of a holding get a Lost
// channel and are registered with the watchdog, their lease of length
// lease having been set by a call sent at sent.
func (s *Semaphore) hold(n int64, sent time.Time, lease time.Duration) {
	s.mu.Lock()
	s.held += n
	if s.held > n {
		ka := s.ka
		s.mu.Unlock()
		if lease >= s.lease() { // a shorter grant lease did not shorten it
			s.c.wd.rearm(ka, sent)
		}
		return
	}
	lost := make(chan struct{})
	ka := &keepalive{
		kind:  "sem",
		owner: s.owner,
		keys:  s.keys[:2],
		ttl:   s.lease(),
		hold:  true,
		renew: s.cfg.lease == 0,
	}
	ka.gone = func() { s.markLost(ka) }
	s.lost, s.isLost, s.ka = lost, false, ka
	s.mu.Unlock()
	if !s.c.wd.add(ka, sent, lease) {
		s.markLost(ka) // the Client was closed meanwhile
	}
}

// markLost closes the Lost channel of the holding whose watchdog entry is
// ka (nil: the current one), unless s has moved on to another holding.
func (s *Semaphore) markLost(ka *keepalive) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == 0 || s.isLost || (ka != nil && ka != s.ka) {
		return
	}
	s.isLost = true
	close(s.lost)
	s.c.wd.remove(s.ka)
}

// drop forgets n permits, and the holding when none are left.
func (s *Semaphore) drop(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held -= n; s.held <= 0 {
		s.held, s.lost, s.isLost, s.ka = 0, nil, false, nil
	}
}

// heartbeat registers a queued waiter with the watchdog, which keeps its
// place alive and nudges w when it finds the waiter dequeued (granted, or
// dropped), or nobody holding permits while it is queued (a lost message,
// or a dead waiter at the head).
func (s *Semaphore) heartbeat(waiter string, w *waiter) *keepalive {
	hb := &keepalive{
		kind:  "wait",
		owner: waiter,
		keys:  []string{s.keys[3], s.keys[4], s.keys[0]},
		ttl:   s.cfg.heartbeat,
		renew: true,
		gone:  w.nudge,
		free:  w.nudge,
	}
	if !s.c.wd.add(hb, time.Now(), s.cfg.heartbeat) {
		return nil
	}
	return hb
}

// check validates s and a number of permits, before any call to Redis.
func (s *Semaphore) check(n int64) error {
	if s.err != nil {
		return s.err
	}
	if n <= 0 || n > s.size {
		return fmt.Errorf("%w: %d is outside [1, %d]", ErrInvalidPermits, n, s.size)
	}
	return nil
}

// begin checks that s can be used and takes s's turn to talk to Redis.
func (s *Semaphore) begin(ctx context.Context) error {
	if err := s.c.usable(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.take(ctx, s.op)
}

// take waits for a slot of ch, ctx or Close.
func (s *Semaphore) take(ctx context.Context, ch chan struct{}) error {
	select {
	case ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.c.ctx.Done():
		return ErrClosed
	}
}

// end gives back s's turn to talk to Redis.
func (s *Semaphore) end() { <-s.op }

// lease is the lease set by an acquire.
func (s *Semaphore) lease() time.Duration {
	return cmp.Or(s.cfg.lease, s.cfg.watchdog)
}

// grantLease is the lease of permits granted to a waiter of s by another
// call: short under the watchdog, which extends it, so that a grant to a
// waiter that just died costs little.
func (s *Semaphore) grantLease() time.Duration {
	if s.cfg.lease > 0 {
		return s.cfg.lease
	}
	return min(s.cfg.heartbeat, s.cfg.watchdog)
}

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
	var oe *opError
	if errors.As(err, &oe) {
		return err
	}
	return &opError{op: op, name: s.name, err: err}
}
