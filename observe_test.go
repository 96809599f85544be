package redisync

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// recorder is an Observer that keeps what it is told. Its Event blocks
// while gate is held by the test.
type recorder struct {
	gate sync.Mutex

	mu     sync.Mutex
	calls  []CallInfo
	events []Event
	bad    []string // CallEnd without its CallStart's context
}

type recorderKey struct{}

func (r *recorder) CallStart(ctx context.Context, c CallInfo) context.Context {
	return context.WithValue(ctx, recorderKey{}, c.Op)
}

func (r *recorder) CallEnd(ctx context.Context, c CallInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Value(recorderKey{}) != c.Op {
		r.bad = append(r.bad, string(c.Op))
	}
	r.calls = append(r.calls, c)
}

func (r *recorder) Event(e Event) {
	r.gate.Lock()
	r.gate.Unlock() //nolint:staticcheck // waits for the test to open the gate
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// outcomes counts the calls of op by outcome.
func (r *recorder) outcomes(op Op) map[Outcome]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := map[Outcome]int{}
	for _, c := range r.calls {
		if c.Op == op {
			n[c.Outcome]++
		}
	}
	return n
}

// kinds returns the events of kind k.
func (r *recorder) kinds(k EventKind) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.events {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// A call is told once when it starts and once when it ends, with the
// context CallStart returned and the outcome the caller saw.
func TestObserverCallOutcomes(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &recorder{}
	c := newClient(t, rdb, WithObserver(rec))
	a, b := must(c.NewMutex("obs")), must(c.NewMutex("obs"))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := b.Lock(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v, want a timeout", err)
	}
	cctx, cancel2 := context.WithCancel(ctx)
	cancel2()
	if err := b.Lock(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock = %v, want cancelled", err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := b.Token()
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Unlock = %v, want ErrNotHeld", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	s := must(c.NewSemaphore("obs", 1))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ok, err := must(c.NewSemaphore("obs", 1)).TryAcquire(ctx, 1); ok || err != nil {
		t.Fatalf("TryAcquire = %v, %v", ok, err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}

	for op, want := range map[Op]map[Outcome]int{
		OpLock:       {OutcomeAcquired: 2, OutcomeTimeout: 1, OutcomeCanceled: 1},
		OpTryLock:    {OutcomeBusy: 1},
		OpUnlock:     {OutcomeReleased: 2, OutcomeError: 1},
		OpAcquire:    {OutcomeAcquired: 1},
		OpTryAcquire: {OutcomeBusy: 1},
		OpRelease:    {OutcomeReleased: 1},
	} {
		if got := rec.outcomes(op); !equalCounts(got, want) {
			t.Errorf("%s: outcomes %v, want %v", op, got, want)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.bad) > 0 {
		t.Errorf("CallEnd without CallStart's context: %v", rec.bad)
	}
	last := rec.calls[5] // b's Lock that acquired
	if last.Op != OpLock || last.Token != token || last.Name != "obs" || last.Primitive != PrimitiveMutex || last.Duration <= 0 {
		t.Errorf("b's Lock told as %+v, want token %d", last, token)
	}
	if sc := rec.calls[len(rec.calls)-1]; sc.Permits != 1 || sc.Primitive != PrimitiveSemaphore {
		t.Errorf("Release told as %+v", sc)
	}
}

func equalCounts(a, b map[Outcome]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A hold is told once taken and once released; a loss once, however it
// is noticed afterwards; Close's releases are told as releases.
func TestObserverHoldEvents(t *testing.T) {
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, withHooksOf(rdb), WithObserver(rec), WithCrashTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := must(c.NewMutex("hold"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := m.Lost()
	mr.Del("redisync:lock:{hold}")
	select {
	case <-lost:
	case <-time.After(5 * time.Second): // the next renewal finds it gone
		t.Fatal("Lost not closed")
	}
	_, _ = m.TTL(ctx)                                       // finds it gone again
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) { // and again
		t.Fatalf("Unlock = %v", err)
	}
	closing := must(c.NewMutex("closing"))
	if err := closing.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.Close() // delivers what is queued before it returns

	taken, released, lostEv := rec.kinds(EventHoldTaken), rec.kinds(EventHoldReleased), rec.kinds(EventHoldLost)
	if len(taken) != 3 || len(released) != 2 || len(lostEv) != 1 {
		t.Fatalf("taken %d, released %d, lost %d; want 3, 2, 1", len(taken), len(released), len(lostEv))
	}
	if e := released[0]; e.Name != "hold" || e.Token != token || e.Held <= 0 || e.Err != nil {
		t.Errorf("release told as %+v", e)
	}
	if e := released[1]; e.Name != "closing" || !errors.Is(e.Err, ErrClosed) {
		t.Errorf("Close's release told as %+v", e)
	}
	if e := lostEv[0]; e.Name != "hold" || e.Primitive != PrimitiveMutex || e.Held <= 0 {
		t.Errorf("loss told as %+v", e)
	}
	if len(rec.kinds(EventRenewal)) == 0 {
		t.Error("no renewal told")
	}
}

// An observer that blocks stalls neither the watchdog (a loss is noticed
// in time) nor the calls; the events it could not take are dropped and
// counted, and the count is told once it takes events again.
func TestObserverBlockedDropsAndCounts(t *testing.T) {
	defer func(n int) { eventQueue = n }(eventQueue)
	eventQueue = 2
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	rec.gate.Lock()
	c := newClient(t, rdb, WithObserver(rec), WithCrashTimeout(300*time.Millisecond))
	m := must(c.NewMutex("blocked"))
	for range 5 {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A fair hand-off to a waiter, and a wake-up, while the observer blocks.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := must(c.NewMutex("blocked"))
	done := make(chan error, 1)
	go func() { done <- waiter.Lock(ctx) }()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return mr.Exists("redisync:lock:{blocked}:waiting") })
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock while the observer blocks")
	}
	// A loss, noticed by the watchdog in time.
	mr.Del("redisync:lock:{blocked}")
	select {
	case <-waiter.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed while the observer blocks")
	}
	rec.gate.Unlock()
	_ = c.Close()
	dropped := 0
	for _, e := range rec.kinds(EventDropped) {
		dropped += e.Count
	}
	// 11 hold events at least, and renewals; the queue holds 2 and the
	// goroutine 1.
	if dropped < 8 {
		t.Errorf("%d events told dropped, want at least 8", dropped)
	}
}

// The logger warns of a lost hold and of a waiter that nobody would wake,
// and writes nothing at Info for calls.
func TestLoggerWarnings(t *testing.T) {
	mr, rdb, _ := newMini(t)
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := New(rdb, withHooksOf(rdb), WithLogger(log), WithCrashTimeout(2*time.Second), WithWaiterTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	m := must(a.NewMutex("logged"))
	for range 3 {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if s := buf.String(); s != "" {
		t.Fatalf("logged at Info on the hot path:\n%s", s)
	}
	// A fair waiter queues; the lock's key goes without a release (as
	// when a hand-off goes to a waiter that died): the waiter's heartbeat
	// finds it free with nobody to announce it.
	done := make(chan error, 1)
	w := must(a.NewMutex("logged"))
	go func() { done <- w.Lock(ctx) }()
	// Its heartbeat is registered once it sleeps, after its last attempt.
	eventually(t, 5*time.Second, "the waiter to sleep", func() bool {
		_, entries := a.wd.Sleepers()
		return entries == 1
	})
	lost := m.Lost()
	mr.Del("redisync:lock:{logged}")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	<-lost // by the renewal's finding, well before the lease's deadline
	_ = a.Close()
	out := buf.String()
	for _, want := range []string{"level=WARN msg=\"redisync: hold lost", "name=logged", "nobody to announce it"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "level=INFO") {
		t.Errorf("logged at Info:\n%s", out)
	}
}

// A pub/sub connection that fails is told once, and waiters go on.
func TestObserverReconnect(t *testing.T) {
	rdb := redistest.Client(t)
	rec := &recorder{}
	c := newClient(t, rdb, WithObserver(rec))
	name := uniqueName(t)
	a, b := must(c.NewMutex(name)), must(c.NewMutex(name))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Lock(ctx) }()
	channel := b.post().channel
	eventually(t, 5*time.Second, "the waiter to subscribe", func() bool {
		return rdb.PubSubNumSub(ctx, channel).Val()[channel] == 1
	})
	if err := rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the reconnection to be told", func() bool { return len(rec.kinds(EventReconnect)) > 0 })
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.kinds(EventReconnect)); n != 1 {
		t.Errorf("%d reconnections told, want 1", n)
	}
}

// A RedMutex tells its calls and its own holds, not its nodes'.
func TestObserverRedMutex(t *testing.T) {
	_, rdbs, _ := newMiniNodes(t, 3)
	rec := &recorder{}
	r, err := NewRedlock(rdbs, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	m := must(r.NewMutex("red"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	if got := rec.outcomes(OpLock); got[OutcomeAcquired] != 1 || len(got) != 1 {
		t.Errorf("Lock outcomes %v", got)
	}
	if got := rec.outcomes(OpUnlock); got[OutcomeReleased] != 1 || len(got) != 1 {
		t.Errorf("Unlock outcomes %v", got)
	}
	taken, released := rec.kinds(EventHoldTaken), rec.kinds(EventHoldReleased)
	if len(taken) != 1 || len(released) != 1 || taken[0].Primitive != PrimitiveRedMutex || taken[0].Token != token {
		t.Errorf("holds told: taken %+v, released %+v", taken, released)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Handoff and Accept are told as a release and a taking by hand-off.
func TestObserverHandoff(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, withHooksOf(rdb), WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	giver, taker := must(c.NewMutex("handed")), must(c.NewMutex("handed"))
	if err := giver.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	handle, err := giver.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := taker.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	token := taker.Token()
	if err := taker.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	taken, released := rec.kinds(EventHoldTaken), rec.kinds(EventHoldReleased)
	if len(taken) != 2 || len(released) != 2 || len(rec.kinds(EventHoldLost)) != 0 {
		t.Fatalf("taken %+v, released %+v", taken, released)
	}
	if taken[0].Handoff || !released[0].Handoff || !taken[1].Handoff || taken[1].Token != token || released[1].Handoff {
		t.Errorf("hand-off told as taken %+v, released %+v", taken, released)
	}
	if got := rec.outcomes(OpHandoff); got[OutcomeReleased] != 1 {
		t.Errorf("Handoff outcomes %v", got)
	}
	if got := rec.outcomes(OpAccept); got[OutcomeAcquired] != 1 {
		t.Errorf("Accept outcomes %v", got)
	}
}

// A RedMutex held when its Redlock is closed is told
// taken and never told released. Redlock.Close closes the node Clients in
// order, the first one (whose events queue carries the RedMutex's events)
// first; the hold ends only when a later node's Close takes the node holds
// below the quorum, and its hold.released event goes into a queue whose
// goroutine has exited.
func TestRedlockCloseTellsHoldReleased(t *testing.T) {
	_, rdbs, _ := newMiniNodes(t, 3)
	rec := &recorder{}
	r, err := NewRedlock(rdbs, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	m := must(r.NewMutex("red-close"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := m.Lost()
	_ = r.Close()
	select {
	case <-lost:
	default:
		t.Fatal("Lost not closed by Close")
	}
	taken, released, lostEv := rec.kinds(EventHoldTaken), rec.kinds(EventHoldReleased), rec.kinds(EventHoldLost)
	if len(taken) != 1 || len(released)+len(lostEv) != 1 {
		t.Fatalf("hold told taken %d times, ended %d times (released %+v, lost %+v); want once each",
			len(taken), len(released)+len(lostEv), released, lostEv)
	}
	if e := released[0]; e.Primitive != PrimitiveRedMutex || !errors.Is(e.Err, ErrClosed) {
		t.Errorf("Close's release told as %+v", e)
	}
}

// A hold whose loss Unlock is the first to notice
// (Redis no longer has it: a failover that lost the key, an eviction, a
// DEL) is told as released, never as lost: the holds-lost counter, which
// docs/operations.md pages on, misses exactly the failover case. Unlock
// itself returns ErrLockLost (outcome "lost").
func TestUnlockFindingHoldGoneToldLost(t *testing.T) {
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, withHooksOf(rdb), WithObserver(rec)) // a 15 s lease: no renewal notices it first
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := must(c.NewMutex("gone"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := m.Lost()
	mr.Del("redisync:lock:{gone}")
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock = %v, want ErrLockLost", err)
	}
	select {
	case <-lost:
	default:
		t.Error("Unlock reported the hold lost, and its Lost channel is open")
	}
	_ = c.Close()
	if got := rec.outcomes(OpUnlock); got[OutcomeLost] != 1 {
		t.Fatalf("Unlock outcomes %v", got)
	}
	released, lostEv := rec.kinds(EventHoldReleased), rec.kinds(EventHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("a hold Redis no longer had told as released %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// The same for a Semaphore's last Release.
func TestReleaseFindingPermitsGoneToldLost(t *testing.T) {
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, withHooksOf(rdb), WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := must(c.NewSemaphore("gone", 2))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	lost := s.Lost()
	mr.Del("redisync:sem:{gone}") // the holders
	mr.Del("redisync:sem:{gone}:expiry")
	if err := s.Release(ctx, 1); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release = %v, want ErrLockLost (keys %v)", err, mr.Keys())
	}
	select {
	case <-lost:
	default:
		t.Error("Release reported the permits lost, and the Lost channel is open")
	}
	_ = c.Close()
	released, lostEv := rec.kinds(EventHoldReleased), rec.kinds(EventHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("permits Redis no longer had told as released %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// The same for a RedMutex whose Unlock finds fewer than a quorum of its
// node holds.
func TestRedUnlockFindingHoldGoneToldLost(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	rec := &recorder{}
	r, err := NewRedlock(rdbs, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := must(r.NewMutex("red-gone"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mrs[0].Del("redisync:lock:{red-gone}")
	mrs[1].Del("redisync:lock:{red-gone}")
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock = %v, want ErrLockLost", err)
	}
	_ = r.Close()
	released, lostEv := rec.kinds(EventHoldReleased), rec.kinds(EventHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("a hold its nodes no longer had told as released %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// And for a Handoff that finds the hold gone.
func TestHandoffFindingHoldGoneToldLost(t *testing.T) {
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, withHooksOf(rdb), WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := must(c.NewMutex("gone"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.Del("redisync:lock:{gone}")
	if _, err := m.Handoff(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Handoff = %v, want ErrLockLost", err)
	}
	_ = c.Close()
	released, lostEv := rec.kinds(EventHoldReleased), rec.kinds(EventHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("a hold Redis no longer had told as handed off %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// Every call on a held lock, an election or a semaphore's size is told to
// the Observer, reads included: Extend, TTL, Proclaim, Leader and
// ResizeSemaphore, with their outcome.
func TestObserverSeesEveryCall(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &recorder{}
	c := newClient(t, rdb, WithObserver(rec))
	m := must(c.NewMutex("m"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := m.TTL(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, time.Minute); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Extend with nothing held: %v", err)
	}
	e := must(c.NewElection("e"))
	if err := e.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if l, err := e.Leader(ctx); err != nil || l.Value != "b" {
		t.Fatalf("Leader: %+v, %v", l, err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ResizeSemaphore(ctx, "s", 2, 3); err != nil {
		t.Fatal(err)
	}
	for op, want := range map[Op]map[Outcome]int{
		OpExtend:   {OutcomeOK: 1, OutcomeError: 1},
		OpTTL:      {OutcomeOK: 1},
		OpProclaim: {OutcomeOK: 1},
		OpLeader:   {OutcomeOK: 1},
		OpResize:   {OutcomeOK: 1},
	} {
		if got := rec.outcomes(op); !maps.Equal(got, want) {
			t.Errorf("%s: outcomes %v, want %v", op, got, want)
		}
	}
	if len(rec.bad) > 0 {
		t.Errorf("CallEnd without its CallStart's context: %v", rec.bad)
	}
}
