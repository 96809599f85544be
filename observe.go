package redisync

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Observer is told what the locks and semaphores of a Client do, for
// metrics, traces and the like (the module
// github.com/redisync/redisync/redisyncotel turns it into OpenTelemetry
// instruments and spans). Set it with WithObserver. Without one, a call
// pays a nil check and nothing else.
//
// Calls (Lock, Acquire, Unlock, ...) are told in the caller's goroutine,
// as net/http/httptrace does: CallStart when the call starts, and CallEnd
// when it returns, with the context that CallStart returned, so that a
// span started there is a child of the caller's span and the parent of
// what the call sends to Redis. Both must be quick and must not block: the
// call waits for them.
//
// What happens in the background (holds taken, renewed, lost, released,
// the subscriber reconnecting, a waiter that died) is told to Event, one
// event at a time, from a goroutine of the Client, through a queue of
// eventQueue events: the watchdog, a hand-off or a wake-up never waits for
// the observer. When the queue is full, an event is dropped and counted;
// the count comes with the next event delivered (EventDropped).
//
// The methods must be safe for concurrent use (a Redlock has a Client, so
// a queue, per node). New kinds of events and new fields may be added:
// ignore what you do not know.
type Observer interface {
	// CallStart is called when a call starts, and returns the context
	// the call goes on with: ctx, or one derived from it.
	CallStart(ctx context.Context, c CallInfo) context.Context
	// CallEnd is called when the call returns, with the context that
	// CallStart returned and c completed (Outcome, Err, Duration, Token).
	CallEnd(ctx context.Context, c CallInfo)
	// Event is called for what happens in the background.
	Event(e Event)
}

// Op names a call told to an Observer.
type Op string

// The calls told to an Observer.
const (
	OpLock       Op = "lock"       // Mutex.Lock, RedMutex.Lock, RWMutex.Lock, MultiMutex.Lock, Election.Campaign
	OpTryLock    Op = "trylock"    // Mutex.TryLock, RedMutex.TryLock, RWMutex.TryLock, MultiMutex.TryLock, Election.TryCampaign
	OpUnlock     Op = "unlock"     // Mutex.Unlock, RedMutex.Unlock, RWMutex.Unlock, MultiMutex.Unlock, Election.Resign
	OpAcquire    Op = "acquire"    // Semaphore.Acquire
	OpTryAcquire Op = "tryacquire" // Semaphore.TryAcquire
	OpRelease    Op = "release"    // Semaphore.Release
	OpHandoff    Op = "handoff"    // Mutex.Handoff
	OpAccept     Op = "accept"     // Mutex.Accept
	OpRLock      Op = "rlock"      // RWMutex.RLock
	OpTryRLock   Op = "tryrlock"   // RWMutex.TryRLock
	OpRUnlock    Op = "runlock"    // RWMutex.RUnlock
	OpExtend     Op = "extend"     // Mutex.Extend, Semaphore.Extend, RWMutex.Extend
	OpTTL        Op = "ttl"        // Mutex.TTL, Semaphore.TTL, RWMutex.TTL
	OpProclaim   Op = "proclaim"   // Election.Proclaim
	OpLeader     Op = "leader"     // Election.Leader
	OpObserve    Op = "observe"    // Election.Observe (errors only: no CallInfo is made)
	OpResize     Op = "resize"     // Client.ResizeSemaphore (Permits: the new size)
)

// Primitive names the kind of lock an event is about.
type Primitive string

// The primitives.
const (
	PrimitiveMutex     Primitive = "mutex"
	PrimitiveSemaphore Primitive = "semaphore"
	PrimitiveRedMutex  Primitive = "redmutex"
	PrimitiveRWMutex   Primitive = "rwmutex"
	// PrimitiveMultiMutex is a MultiMutex's calls (named by its names
	// joined with "+"); the holds of its names are told as a Mutex's.
	PrimitiveMultiMutex Primitive = "multimutex"
	// PrimitiveElection is an Election: its Campaign is told as OpLock,
	// its TryCampaign as OpTryLock, its Resign as OpUnlock, and its
	// leadership as a hold.
	PrimitiveElection Primitive = "election"
)

// Outcome is how a call ended.
type Outcome string

// The outcomes of a call.
const (
	OutcomeAcquired Outcome = "acquired" // a lock or permits were taken (or a lock re-entered)
	OutcomeBusy     Outcome = "busy"     // TryLock or TryAcquire found them taken
	OutcomeReleased Outcome = "released" // Unlock, RUnlock, Release or Handoff gave them back
	OutcomeOK       Outcome = "ok"       // a call that takes and gives back nothing (Extend, TTL, Proclaim, Leader, ResizeSemaphore) succeeded
	OutcomeTimeout  Outcome = "timeout"  // the context's deadline passed (context.DeadlineExceeded)
	OutcomeCanceled Outcome = "canceled" // the context was canceled (context.Canceled)
	OutcomeLost     Outcome = "lost"     // the hold had been lost (ErrLockLost)
	OutcomeError    Outcome = "error"    // any other error
)

// CallInfo is one call told to an Observer.
type CallInfo struct {
	Op        Op
	Primitive Primitive
	Name      string    // of the lock or semaphore: unbounded, see docs/operations.md
	Permits   int64     // a Semaphore's Acquire, TryAcquire or Release: permits asked; else 0
	Start     time.Time // when the call started

	// Set for CallEnd.
	Outcome  Outcome
	Err      error         // what the call returned; nil when it succeeded
	Duration time.Duration // how long the call took: for Lock and Acquire, the wait
	Token    int64         // the fencing token of the hold a lock call took; else 0
}

// EventKind names a background event.
type EventKind string

// The kinds of background events.
const (
	// EventHoldTaken: a hold (a lock, or a semaphore's holding going from
	// no permits to some) was taken; Handoff says whether it was handed
	// over (by a fair lock's release, or Accept).
	EventHoldTaken EventKind = "hold.taken"
	// EventHoldReleased: a hold was given back (Unlock, Release of the
	// last permits, Handoff, or Close, when Err is ErrClosed); Held is
	// how long it lasted.
	EventHoldReleased EventKind = "hold.released"
	// EventHoldLost: a hold was lost (Lost closed): its lease could not
	// be renewed in time or Redis no longer had it; or the Unlock,
	// Release or Handoff that gave it back found that Redis no longer
	// had it (the call returns ErrLockLost). Told once per hold.
	EventHoldLost EventKind = "hold.lost"
	// EventRenewal: the watchdog renewed a batch of Count entries (holds
	// and fair waiters' heartbeats) in one call that took Latency.
	EventRenewal EventKind = "renewal"
	// EventRenewalFailed: a renewal call of Count entries failed with Err
	// after Latency; the watchdog tries again soon, and a hold whose
	// lease runs out meanwhile is lost.
	EventRenewalFailed EventKind = "renewal.failed"
	// EventReconnect: a pub/sub connection of the subscriber failed (Err)
	// and is being re-established; its waiters look again once it is.
	EventReconnect EventKind = "subscriber.reconnect"
	// EventDeadWaiter: a queued waiter's heartbeat found its lock free,
	// or its semaphore's queue headed by a waiter that died, with nobody
	// to announce it: most often a hand-off to a waiter that had died
	// ran out. The waiters of this process look again at once.
	EventDeadWaiter EventKind = "waiter.dead"
	// EventDropped: Count events were dropped because the queue was full.
	EventDropped EventKind = "events.dropped"
)

// Event is a background event told to an Observer (and to the logger).
type Event struct {
	Kind      EventKind
	Time      time.Time
	Primitive Primitive     // holds and waiters: the kind of lock
	Name      string        // holds and waiters: the lock's or semaphore's name
	Token     int64         // a Mutex's or RedMutex's hold: its fencing token
	Permits   int64         // a semaphore's holding: the permits held
	Handoff   bool          // hold.taken, hold.released: handed over
	Held      time.Duration // hold.released, hold.lost: how long the hold lasted
	Latency   time.Duration // renewal, renewal.failed: the call's round trip
	Count     int           // renewal: entries of the batch; events.dropped: events dropped
	Err       error         // renewal.failed, subscriber.reconnect; hold.released at Close: ErrClosed
}

// eventQueue is how many background events wait for the observer and the
// logger before more are dropped.
var eventQueue = 1024 // a variable for tests

// outcome classifies what a call returned; ok is what it reports (a Try
// that found the lock taken returns false and no error).
func outcome(op Op, ok bool, err error) Outcome {
	switch {
	case err == nil && !ok:
		return OutcomeBusy
	case err == nil && (op == OpUnlock || op == OpRUnlock || op == OpRelease || op == OpHandoff):
		return OutcomeReleased
	case err == nil && (op == OpExtend || op == OpTTL || op == OpProclaim || op == OpLeader || op == OpResize):
		return OutcomeOK
	case err == nil:
		return OutcomeAcquired
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeTimeout
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	case errors.Is(err, ErrLockLost):
		return OutcomeLost
	}
	return OutcomeError
}

// observation is one call being told to an Observer.
type observation struct {
	obs  Observer
	call CallInfo
}

// observed runs call, the body of a public method, telling obs of it as
// the call c when there is an observer; token (nil: none) gives the token
// of the hold the call took.
func observed(obs Observer, ctx context.Context, c CallInfo, call func(context.Context) error, token func() int64) error {
	_, err := observedTry(obs, ctx, c, func(ctx context.Context) (bool, error) { return true, call(ctx) }, token)
	return err
}

// observedTry is observed for a call that reports whether it took
// something.
func observedTry(obs Observer, ctx context.Context, c CallInfo, call func(context.Context) (bool, error), token func() int64) (bool, error) {
	if obs == nil {
		return call(ctx)
	}
	ctx, o := observe(obs, ctx, c)
	ok, err := call(ctx)
	var t int64
	if token != nil {
		t = token()
	}
	o.end(ctx, ok, err, t)
	return ok, err
}

// observe tells obs, which must not be nil, that the call starts, and
// returns the context the call goes on with.
func observe(obs Observer, ctx context.Context, call CallInfo) (context.Context, observation) {
	call.Start = time.Now()
	return obs.CallStart(ctx, call), observation{obs, call}
}

// end tells the observer that the call returned ok (false: a Try found
// the lock taken) and err, with the token of the hold it took.
func (o observation) end(ctx context.Context, ok bool, err error, token int64) {
	o.call.Outcome = outcome(o.call.Op, ok, err)
	o.call.Err, o.call.Duration = err, time.Since(o.call.Start)
	if o.call.Outcome == OutcomeAcquired {
		o.call.Token = token
	}
	o.obs.CallEnd(ctx, o.call)
}

// events is a Client's queue of background events, and the goroutine that
// delivers them to the observer and the logger, one at a time, started by
// the first event. Sending never blocks: an event that finds the queue
// full is dropped and counted.
type events struct {
	obs     Observer     // may be nil
	log     *slog.Logger // may be nil
	q       chan Event
	stop    chan struct{} // closed by close: deliver what is queued and exit
	started sync.Once
	dropped atomic.Uint64
	abandon atomic.Bool // close stopped waiting: deliver nothing more

	mu     sync.Mutex
	closed bool
	exited chan struct{} // closed when the goroutine returns; nil until it starts
}

// newEvents returns the queue of a Client with an observer or a logger
// (either may be nil), or nil when it has neither.
func newEvents(obs Observer, log *slog.Logger) *events {
	if obs == nil && log == nil {
		return nil
	}
	return &events{obs: obs, log: log, q: make(chan Event, eventQueue), stop: make(chan struct{})}
}

// start starts the goroutine, unless the queue is closed.
func (q *events) start() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.exited = make(chan struct{})
		go q.run()
	}
}

// emit queues e, or drops it when the queue is full. It never blocks. q
// may be nil.
func (q *events) emit(e Event) {
	if q == nil {
		return
	}
	q.started.Do(q.start)
	e.Time = time.Now()
	select {
	case q.q <- e:
	default:
		q.dropped.Add(1)
	}
}

// run delivers the queued events until close, then those still queued,
// unless close stopped waiting for them.
// Renewed tells a renewal call of n entries that took latency
// (watchdog.Events).
func (q *events) Renewed(n int, latency time.Duration) {
	q.emit(Event{Kind: EventRenewal, Count: n, Latency: latency})
}

// RenewFailed tells a renewal call of n entries that failed with err.
func (q *events) RenewFailed(n int, latency time.Duration, err error) {
	q.emit(Event{Kind: EventRenewalFailed, Count: n, Latency: latency, Err: err})
}

// DeadWaiter tells that waiters of a lock ("wait") or semaphore ("swait")
// found it held by nobody to wake them.
func (q *events) DeadWaiter(kind, name string) {
	prim := PrimitiveMutex
	if kind == "swait" {
		prim = PrimitiveSemaphore
	}
	q.emit(Event{Kind: EventDeadWaiter, Primitive: prim, Name: name})
}

func (q *events) run() {
	defer close(q.exited)
	var told uint64 // drops told so far
	deliver := func(e Event) {
		q.deliver(e)
		if n := q.dropped.Load(); n > told {
			q.deliver(Event{Kind: EventDropped, Time: time.Now(), Count: int(n - told)})
			told = n
		}
	}
	for {
		select {
		case e := <-q.q:
			deliver(e)
		case <-q.stop:
			for !q.abandon.Load() {
				select {
				case e := <-q.q:
					deliver(e)
				default:
					return
				}
			}
			return
		}
	}
}

// close delivers what is queued, stops the goroutine and waits for it,
// until ctx ends: an observer or a log handler that blocks does not hold
// it longer (the goroutine then delivers nothing more, and returns when
// the call it is in returns). Later events are never delivered. It is
// idempotent; q may be nil.
func (q *events) close(ctx context.Context) {
	if q == nil {
		return
	}
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.stop)
	}
	exited := q.exited
	q.mu.Unlock()
	if exited == nil || q.abandon.Load() {
		return
	}
	select {
	case <-exited:
	case <-ctx.Done():
		q.abandon.Store(true)
	}
}

// deliver tells the logger and the observer about e.
func (q *events) deliver(e Event) {
	if q.log != nil {
		logEvent(q.log, e)
	}
	if q.obs != nil {
		q.obs.Event(e)
	}
}

// WithObserver makes the Client tell o what its locks and semaphores do
// (see Observer). It only has an effect as an option of New (and of
// NewRedlock, whose node Clients share o).
//
// The default is no observer: a call then pays one nil check.
func WithObserver(o Observer) Option {
	return option("WithObserver", atClient|atRedlock, func(cfg *config) { cfg.obs = o })
}

// logEvent writes e to log: at Warn what an operator must see (a hold
// lost, a renewal failing, the subscriber reconnecting, a waiter that
// died, events dropped), at Debug everything else. Calls (Lock, Unlock,
// ...) are never logged: nothing on the hot path writes a log.
func logEvent(log *slog.Logger, e Event) {
	ctx := context.Background()
	level, msg := slog.LevelDebug, ""
	switch e.Kind {
	case EventHoldLost:
		level, msg = slog.LevelWarn, "redisync: hold lost: its lease could not be renewed in time, or Redis no longer had it"
	case EventRenewalFailed:
		level, msg = slog.LevelWarn, "redisync: lease renewal failed; retrying until the leases run out"
	case EventReconnect:
		level, msg = slog.LevelWarn, "redisync: pub/sub connection failed; reconnecting (waiters poll meanwhile)"
	case EventDeadWaiter:
		level, msg = slog.LevelWarn, "redisync: lock found free with waiters queued and nobody to announce it: a hand-off to a waiter that had died ran out"
	case EventDropped:
		level, msg = slog.LevelWarn, "redisync: events dropped: the observer or the logger is too slow"
	case EventHoldTaken:
		msg = "redisync: hold taken"
	case EventHoldReleased:
		msg = "redisync: hold released"
	case EventRenewal:
		msg = "redisync: leases renewed"
	default:
		msg = "redisync: " + string(e.Kind)
	}
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	if e.Name != "" {
		attrs = append(attrs, slog.String("primitive", string(e.Primitive)), slog.String("name", e.Name))
	}
	if e.Token != 0 {
		attrs = append(attrs, slog.Int64("token", e.Token))
	}
	if e.Permits != 0 {
		attrs = append(attrs, slog.Int64("permits", e.Permits))
	}
	if e.Handoff {
		attrs = append(attrs, slog.Bool("handoff", true))
	}
	if e.Held != 0 {
		attrs = append(attrs, slog.Duration("held", e.Held))
	}
	if e.Latency != 0 {
		attrs = append(attrs, slog.Duration("latency", e.Latency))
	}
	if e.Count != 0 {
		attrs = append(attrs, slog.Int("count", e.Count))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	log.LogAttrs(ctx, level, msg, attrs...)
}

// WithLogger makes the Client log, through l, the events an operator must
// see, at Warn: a hold lost, lease renewals failing, the subscriber's
// pub/sub connection reconnecting, a hand-off to a waiter that had died,
// and events dropped because l (or the observer) could not keep up; and
// other background events (holds taken, released, renewed) at Debug. Calls
// are never logged, and nothing is written from a call's goroutine: the
// records are written by a goroutine of the Client, through the queue that
// feeds the Observer, so a slow handler never stalls the watchdog or a
// waiter (records it cannot take are dropped and counted). It only has an
// effect as an option of New (and of NewRedlock).
//
// The default, as with a nil l, is no logging.
func WithLogger(l *slog.Logger) Option {
	return option("WithLogger", atClient|atRedlock, func(cfg *config) { cfg.log = l })
}
