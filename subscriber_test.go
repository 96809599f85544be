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

// When the connection fails under the SUBSCRIBE
// that the subscriber writes for a new channel (a reset, a restart, a
// failover at that moment), go-redis replaces the connection inside that
// write and subscribes on the new one the channels it knew before the
// call, not the new ones (it adds them to its set after the write). The
// subscriber ignores the write's error ("a failed write fails the shard's
// next read"), but no read fails: the channel is never subscribed again,
// its waiters stay deaf (polling every 250 ms) for as long as the shard
// lives, and the reconnection is not told.
func TestSubscribeWriteFailureResubscribes(t *testing.T) {
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
	warmHolder, warmWaiter := must(c.NewMutex("warm")), must(c.NewMutex("warm"))
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

	a, b := must(c.NewMutex("deaf")), must(c.NewMutex("deaf"))
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
	if n := len(rec.kinds(EventReconnect)); n != 1 {
		t.Errorf("%d reconnections told, want 1", n)
	}
}
