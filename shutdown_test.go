package redisync

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// refuseHook is a go-redis hook that, once armed, holds up every command
// until its context ends (stall) or fails it at once (fail).
type refuseHook struct {
	passDial
	stall, fail atomic.Bool
}

var errRefused = errors.New("refused by the test")

func (h *refuseHook) refuse(ctx context.Context) error {
	switch {
	case h.stall.Load():
		<-ctx.Done()
		return ctx.Err()
	case h.fail.Load():
		return errRefused
	}
	return nil
}

func (h *refuseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.refuse(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *refuseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.refuse(ctx); err != nil {
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// checkUnreleased fails t unless err names the hold of name as not
// released: an *OpError of "close" wrapping ErrUnconfirmed.
func checkUnreleased(t *testing.T, err error, name string) {
	t.Helper()
	var oe *OpError
	if !errors.Is(err, ErrUnconfirmed) || !errors.As(err, &oe) || oe.Op != "close" || oe.Name != name {
		t.Fatalf("got %v, want an *OpError of close %q wrapping ErrUnconfirmed", err, name)
	}
}

func TestShutdownReleasesEveryHold(t *testing.T) {
	_, rdb, _ := newMini(t)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		t.Fatal(err)
	}
	m := must(c.NewMutex("job"))
	s := must(c.NewSemaphore("slots", 2))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case <-m.Lost():
	default:
		t.Error("Lost not closed by Shutdown")
	}
	if err := m.Lock(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Lock after Shutdown: %v, want ErrClosed", err)
	}
	other := newClient(t, rdb)
	if ok, err := must(other.NewMutex("job")).TryLock(ctx); !ok || err != nil {
		t.Errorf("the lock after Shutdown: %v, %v; want it free", ok, err)
	}
	if ok, err := must(other.NewSemaphore("slots", 2)).TryAcquire(ctx, 2); !ok || err != nil {
		t.Errorf("the permits after Shutdown: %v, %v; want them free", ok, err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Errorf("a second Shutdown: %v", err)
	}
}

// TestShutdownReturnsByItsContext: a Shutdown whose releases cannot reach
// Redis returns when its ctx ends, naming each hold it could not release
// and ctx's error; the holds run out in Redis by their lease.
func TestShutdownReturnsByItsContext(t *testing.T) {
	_, rdb, _ := newMini(t)
	hook := &refuseHook{}
	addHook(rdb, hook)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		t.Fatal(err)
	}
	m := must(c.NewMutex("stalled", WithFixedLease(time.Minute)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hook.stall.Store(true)
	const wait = 200 * time.Millisecond
	sctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	err = c.Shutdown(sctx)
	if took := time.Since(start); took > wait+500*time.Millisecond {
		t.Errorf("Shutdown took %v with a ctx of %v", took, wait)
	}
	checkUnreleased(t, err, "stalled")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown: %v, want ctx's error too", err)
	}
	hook.stall.Store(false)
	if err := c.Close(); err != nil { // waits for what is left
		t.Errorf("Close after Shutdown: %v", err)
	}
	other := newClient(t, rdb)
	if ok, err := must(other.NewMutex("stalled")).TryLock(ctx); ok || err != nil {
		t.Errorf("the lock not released: TryLock %v, %v; want held until its lease runs out", ok, err)
	}
}

func TestCloseReportsAFailedRelease(t *testing.T) {
	_, rdb, _ := newMini(t)
	hook := &refuseHook{}
	addHook(rdb, hook)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		t.Fatal(err)
	}
	s := must(c.NewSemaphore("refused", 3))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	hook.fail.Store(true)
	err = c.Close()
	checkUnreleased(t, err, "refused")
	if !errors.Is(err, errRefused) {
		t.Errorf("Close: %v, want the cause too", err)
	}
}

func TestRedlockShutdownNamesTheNode(t *testing.T) {
	_, rdbs, _ := newMiniNodes(t, 3)
	hook := &refuseHook{}
	addHook(rdbs[1].(*redis.Client), hook)
	r, err := NewRedlock(rdbs, withHooksOf(rdbs...))
	if err != nil {
		t.Fatal(err)
	}
	m := must(r.NewMutex("ledger"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hook.fail.Store(true)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = r.Shutdown(sctx)
	checkUnreleased(t, err, "ledger")
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Node != 1 {
		t.Fatalf("Shutdown: %v, want node 1's *NodeError", err)
	}
}

// gateHook holds every command, once armed, until open is closed; entered
// gets a value when the first one is held.
type gateHook struct {
	passHooks
	armed   atomic.Bool
	entered chan struct{} // buffered, of 1
	open    chan struct{}
}

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() {
			select {
			case h.entered <- struct{}{}:
			default:
			}
			<-h.open
		}
		return next(ctx, cmd)
	}
}

// TestSecondShutdownWaitsForTheReleases: a Close that comes while a
// Shutdown sends the releases returns once they are done, as a second
// Shutdown's doc says, not while the lock is still held.
func TestSecondShutdownWaitsForTheReleases(t *testing.T) {
	_, rdb, _ := newMini(t)
	gate := &gateHook{entered: make(chan struct{}, 1), open: make(chan struct{})}
	addHook(rdb, gate)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		t.Fatal(err)
	}
	if err := must(c.NewMutex("job")).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	gate.armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- c.Shutdown(ctx) }()
	select {
	case <-gate.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown sent no release within 5 s")
	}
	second := make(chan error, 1)
	go func() { second <- c.Close() }()
	select {
	case err := <-second:
		t.Fatalf("Close returned (%v) while the release was still under way", err)
	case <-time.After(100 * time.Millisecond): // it would return at once
	}
	close(gate.open)
	for _, done := range []chan error{first, second} {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if ok, err := must(newClient(t, rdb).NewMutex("job")).TryLock(ctx); !ok || err != nil {
		t.Errorf("the lock after both returned: %v, %v; want it free", ok, err)
	}
}
