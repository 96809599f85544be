package redisync

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Review 9, finding 1: a RedMutex held when its Redlock is closed is told
// taken and never told released. Redlock.Close closes the node Clients in
// order, the first one (whose events queue carries the RedMutex's events)
// first; the hold ends only when a later node's Close takes the node holds
// below the quorum, and its hold.released event goes into a queue whose
// goroutine has exited.
func TestReview9RedlockCloseTellsHoldReleased(t *testing.T) {
	_, rdbs, _ := newMiniNodes(t, 3)
	rec := &recorder{}
	r, err := NewRedlock(rdbs, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	m := r.NewMutex("red-close")
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
	taken, released, lostEv := rec.kinds(KindHoldTaken), rec.kinds(KindHoldReleased), rec.kinds(KindHoldLost)
	if len(taken) != 1 || len(released)+len(lostEv) != 1 {
		t.Fatalf("hold told taken %d times, ended %d times (released %+v, lost %+v); want once each",
			len(taken), len(released)+len(lostEv), released, lostEv)
	}
	if e := released[0]; e.Primitive != PrimitiveRedMutex || !errors.Is(e.Err, ErrClosed) {
		t.Errorf("Close's release told as %+v", e)
	}
}

// Review 9, finding 2: a hold whose loss Unlock is the first to notice
// (Redis no longer has it: a failover that lost the key, an eviction, a
// DEL) is told as released, never as lost: the holds-lost counter, which
// docs/operations.md pages on, misses exactly the failover case. Unlock
// itself returns ErrLockLost (outcome "lost").
func TestReview9UnlockFindingHoldGoneToldLost(t *testing.T) {
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, WithObserver(rec)) // a 30 s lease: no renewal notices it first
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := c.NewMutex("gone")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.Del("redisync:lock:{gone}")
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock = %v, want ErrLockLost", err)
	}
	_ = c.Close()
	if got := rec.outcomes(OpUnlock); got[OutcomeLost] != 1 {
		t.Fatalf("Unlock outcomes %v", got)
	}
	released, lostEv := rec.kinds(KindHoldReleased), rec.kinds(KindHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("a hold Redis no longer had told as released %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// The same for a Semaphore's last Release.
func TestReview9ReleaseFindingPermitsGoneToldLost(t *testing.T) {
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.NewSemaphore("gone", 2)
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	mr.Del("redisync:sem:{gone}") // the holders
	mr.Del("redisync:sem:{gone}:expiry")
	if err := s.Release(ctx, 1); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release = %v, want ErrLockLost (keys %v)", err, mr.Keys())
	}
	_ = c.Close()
	released, lostEv := rec.kinds(KindHoldReleased), rec.kinds(KindHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("permits Redis no longer had told as released %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// Review 9, finding 3: a plain wake-up that a call took, and that no
// attempt used (the attempt failed: Redis away for a moment), is forgotten
// by the next wait that brings no signal, so that the call, ending with an
// error afterwards, does not pass it on: the other waiter of the process
// sleeps to its bound although the lock is free.
func TestReview9UnusedWakeupSurvivesAnEmptyWait(t *testing.T) {
	r := newRegistry(nil)
	r.channels["ch"] = &channel{name: "ch", ready: make(chan struct{}), confirmed: true}
	a, b := newWaitSet(), newWaitSet()
	r.addConfirmed(a, "ch", "a", true)
	r.addConfirmed(b, "ch", "b", true)
	r.deliver("ch", "") // a release: wakes a
	if _, err := a.wait(ctx, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	// a's attempt fails transiently (no used()), it backs off: a wait
	// with no signal.
	if _, err := a.wait(ctx, time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	// Then its ctx ends: it leaves, passing on what it did not use.
	a.leave(true)
	select {
	case <-b.bell:
	default:
		t.Fatal("the wake-up a took and never used was not passed on to b")
	}
}

// Review 9, finding 4: when the connection fails under the SUBSCRIBE
// that the subscriber writes for a new channel (a reset, a restart, a
// failover at that moment), go-redis replaces the connection inside that
// write and subscribes on the new one the channels it knew before the
// call, not the new ones (it adds them to its set after the write). The
// subscriber ignores the write's error ("a failed write fails the shard's
// next read"), but no read fails: the channel is never subscribed again,
// its waiters stay deaf (polling every 250 ms) for as long as the shard
// lives, and the reconnection is not told.
func TestReview9SubscribeWriteFailureResubscribes(t *testing.T) {
	mr := miniredis.RunT(t)
	channel := "redisync:lock:{deaf}:ch" // the start of b's grant channel
	var armed atomic.Bool
	armed.Store(true)
	rdb := redis.NewClient(&redis.Options{
		Addr: mr.Addr(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			cn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &failSubscribe{Conn: cn, channel: []byte(channel), armed: &armed}, nil
		},
	})
	t.Cleanup(func() { _ = rdb.Close() })
	rec := &recorder{}
	c := newClient(t, rdb, WithObserver(rec))
	// A waiter of another lock first, so that the subscriber's reader
	// already runs when the SUBSCRIBE write fails: go-redis v9.0.0 races
	// (in its own code: PubSub.cmd, set by the first ReceiveTimeout and
	// read by a reconnection inside Subscribe) when the two come at once.
	warmHolder, warmWaiter := c.NewMutex("warm"), c.NewMutex("warm")
	if err := warmHolder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	warmDone := make(chan error, 1)
	go func() { warmDone <- warmWaiter.Lock(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); confirmedWaiters(c, warmWaiter.post().channel) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the warm-up waiter never subscribed")
		}
	}

	a, b := c.NewMutex("deaf"), c.NewMutex("deaf")
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Lock(ctx) }()
	eventually(t, 5*time.Second, "the SUBSCRIBE to fail", func() bool { return !armed.Load() })
	deadline := time.Now().Add(3 * time.Second)
	for confirmedWaiters(c, b.post().channel) != 1 {
		if time.Now().After(deadline) {
			t.Errorf("the channel was never subscribed again after its SUBSCRIBE failed: its waiter is deaf")
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warmHolder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-warmDone; err != nil {
		t.Fatal(err)
	}
	if err := warmWaiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if n := len(rec.kinds(KindReconnect)); n != 1 {
		t.Errorf("%d reconnections told, want 1", n)
	}
}

// failSubscribe is a connection whose first write of a SUBSCRIBE of
// channel, while armed, fails and resets it.
type failSubscribe struct {
	net.Conn
	channel []byte
	armed   *atomic.Bool
}

func (c *failSubscribe) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("subscribe")) && bytes.Contains(p, c.channel) && c.armed.CompareAndSwap(true, false) {
		_ = c.Conn.Close()
		return 0, errors.New("injected: connection reset by peer")
	}
	return c.Conn.Write(p)
}

// The same for a RedMutex whose Unlock finds fewer than a quorum of its
// node holds.
func TestReview9RedUnlockFindingHoldGoneToldLost(t *testing.T) {
	mrs, rdbs, _ := newMiniNodes(t, 3)
	rec := &recorder{}
	r, err := NewRedlock(rdbs, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := r.NewMutex("red-gone")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mrs[0].Del("redisync:lock:{red-gone}")
	mrs[1].Del("redisync:lock:{red-gone}")
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock = %v, want ErrLockLost", err)
	}
	_ = r.Close()
	released, lostEv := rec.kinds(KindHoldReleased), rec.kinds(KindHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("a hold its nodes no longer had told as released %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// And for a Handoff that finds the hold gone.
func TestReview9HandoffFindingHoldGoneToldLost(t *testing.T) {
	mr, rdb, _ := newMini(t)
	rec := &recorder{}
	c, err := New(rdb, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := c.NewMutex("gone")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.Del("redisync:lock:{gone}")
	if _, err := m.Handoff(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Handoff = %v, want ErrLockLost", err)
	}
	_ = c.Close()
	released, lostEv := rec.kinds(KindHoldReleased), rec.kinds(KindHoldLost)
	if len(lostEv) != 1 || len(released) != 0 {
		t.Errorf("a hold Redis no longer had told as handed off %d times and lost %d times; want lost once", len(released), len(lostEv))
	}
}

// Review 9, finding 5: Close waits without bound for the observer (or the
// log handler) to take every queued event: one that blocks (an exporter
// stuck on the network, a log sink that stalls) hangs Close for good, and
// a slow one delays it by up to the queue's 1,024 events times its
// latency, past the 2 s that Close otherwise allows its releases.
func TestReview9CloseDoesNotWaitForABlockedObserver(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &recorder{}
	rec.gate.Lock()
	c, err := New(rdb, WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMutex("blocked-close")
	if err := m.Lock(ctx); err != nil { // an event the observer blocks on
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeTimeout + 2*time.Second):
		t.Error("Close waits for an observer that blocks")
	}
	rec.gate.Unlock()
	<-closed
}
