package fault

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestHandoffDeadlineCountsFromGrant: a hold
// handed to a fair waiter by a release must count its lease from the
// moment the release granted it in Redis, not from the moment the waiter
// received the message; so its Lost channel closes no later than Redis
// lets anyone else in, whatever the latency.
//
// The waiter's Client talks to Redis through a proxy with 150 ms of
// latency each way; the holder (direct) releases, handing the lock over.
// The waiter's hold then cannot be extended: it has a fixed lease
// (fixed-lease, WithFixedLease 600 ms), or its requests are swallowed from just
// before the release while Redis's messages still reach it
// (watchdog-half-open, WithCrashTimeout 1.5 s, which caps the hand-off
// lease; the heartbeat keeps its default of 3 s). A direct
// Client takes the lock with TryLock as soon as Redis lets it; at that
// moment the waiter's Lost must be closed. Where this does not hold, it
// closes ~140 ms after (the latency, less the drift margin).
func TestHandoffDeadlineCountsFromGrant(t *testing.T) {
	const latency = 150 * time.Millisecond
	for _, tc := range []struct {
		name     string
		opts     []redisync.Option
		lease    time.Duration // of the handed-over hold
		halfOpen bool
	}{
		{"fixed-lease", []redisync.Option{redisync.WithFixedLease(600 * time.Millisecond)}, 600 * time.Millisecond, false},
		{"watchdog-half-open", []redisync.Option{redisync.WithCrashTimeout(1500 * time.Millisecond)}, 1500 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			admin := redistest.NewClient(t, addr)
			px := redistest.NewProxy(t, addr)
			px.SetLatency(latency)
			name := redistest.Name(t)

			holder := must(newClient(t, addr).NewMutex(name))
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			waiter := must(newClient(t, px.Addr).NewMutex(name, tc.opts...))
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			done := lockAsync(waiter, lctx)
			eventually(t, 5*time.Second, "the waiter to queue and subscribe", func() bool {
				return queued(t, admin, name) == 1 && subscribers(t, admin, name) == 1
			})
			// Let it finish its attempts, so that the release reaches it as
			// a message (the path under test).
			settle(t, admin, name, 3*latency, 5*time.Second)
			if tc.halfOpen {
				px.SetBlackholeRequests(true)
			}

			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			granted := time.Now() // the release script has run: the hand-off lease runs from here
			poller := must(newClient(t, addr).NewMutex(name))
			r := await(t, done, 3*time.Second, "the waiter's Lock")
			lost := waiter.Lost()
			lostAt := closedAt(lost)
			got, lostFirst := grab(t, poller, lost, tc.lease+2*time.Second)
			t.Logf("grant to waiter's Lock returning %v; grant to another Client holding it %v (hand-off lease %v)",
				r.at.Sub(granted).Round(time.Millisecond), got.Sub(granted).Round(time.Millisecond), tc.lease)
			if !lostFirst {
				select {
				case la := <-lostAt:
					t.Errorf("another Client held the lock %v after the grant, the waiter's Lost closed only %v after the grant (%v late)",
						got.Sub(granted).Round(time.Millisecond), la.Sub(granted).Round(time.Millisecond), la.Sub(got).Round(time.Millisecond))
				case <-time.After(2 * time.Second):
					t.Errorf("another Client held the lock %v after the grant; the waiter's Lost still open 2s later", got.Sub(granted).Round(time.Millisecond))
				}
			}
			if err := poller.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			px.SetBlackholeRequests(false)
			px.ResetAll()
			unlockQuietly(waiter)
		})
	}
}

// TestLongQueuedHandoffKeepsHold checks the other side
// of the hand-off deadline: a fair waiter queued for 10 s behind 150 ms of latency each
// way (watchdog lease 900 ms) and then handed the lock keeps the hold: it
// stays queued meanwhile, its Lock returns within 1 s of the release, the
// hold is neither lost nor taken by anyone else for two watchdog leases
// (no undo-and-requeue), its token is the lock's latest; and when its
// connection is then blackholed, its Lost closes before another Client
// gets the lock. Each case runs on a Redis of its own, which has not
// cached the watchdog's script yet.
//
//   - heartbeat-3s (the default; hand-off lease 900 ms, the watchdog
//     lease): expected to pass where this does not hold too.
//   - heartbeat-600ms (hand-off lease 600 ms; a round trip is half of it):
//     where this does not hold the waiter does not even stay queued. Each
//     heartbeat call is abandoned after heartbeat/3 = 200 ms, before its
//     reply: the first gets NOSCRIPT and its EVAL fallback is never sent,
//     later ones wait for new connections whose handshake outlasts the
//     200 ms; the queue's keys expire 1.2 s after the last attempt. A
//     handed-over hold cannot be kept with such a heartbeat, and is not
//     required to be: its deadline counts from the last heartbeat Redis
//     confirmed before the grant (up to a third of the heartbeat and a
//     round trip earlier), and its first renewal takes another round trip,
//     so a hand-off lease under three round trips runs out first (see
//     WithWaiterTimeout). This case checks that the waiter stays queued and,
//     after the hand-off, only that nobody else holds the lock while the
//     waiter's Lost is open.
func TestLongQueuedHandoffKeepsHold(t *testing.T) {
	for _, tc := range []struct {
		name      string
		heartbeat time.Duration
		keeps     bool
	}{{"heartbeat-3s", 3 * time.Second, true}, {"heartbeat-600ms", 600 * time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) { testLongQueuedHandoff(t, tc.heartbeat, tc.keeps) })
	}
}

func testLongQueuedHandoff(t *testing.T, heartbeat time.Duration, keeps bool) {
	const (
		latency = 150 * time.Millisecond
		lease   = 900 * time.Millisecond
		queue   = 10 * time.Second
	)
	addr := redistest.Spawn(t).Addr
	admin := redistest.NewClient(t, addr)
	px := redistest.NewProxy(t, addr)
	px.SetLatency(latency)
	name := redistest.Name(t)

	holder := must(newClient(t, addr).NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := must(newClient(t, px.Addr).NewMutex(name,
		redisync.WithWaiterTimeout(heartbeat), redisync.WithCrashTimeout(lease)))
	lctx, cancel := context.WithTimeout(ctx, queue+10*time.Second)
	defer cancel()
	done := lockAsync(waiter, lctx)
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return queued(t, admin, name) == 1 })
	queuedAt := time.Now()

	// Keep it queued for 10 s (a deliberate duration), checking that it
	// stays queued.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(queuedAt) < queue {
		select {
		case r := <-done:
			t.Fatalf("the waiter's Lock returned while the lock was held: %v", r.err)
		case <-tick.C:
			if n := queued(t, admin, name); n != 1 {
				t.Fatalf("%v after queueing, %d waiters are queued, want 1 (heartbeats lost to the latency?)", time.Since(queuedAt).Round(time.Millisecond), n)
			}
		}
	}

	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := await(t, done, 5*time.Second, "the waiter's Lock")
	if d := r.at.Sub(released); d > time.Second {
		t.Fatalf("the waiter's Lock returned %v after the release, want <= 1s", d)
	}
	lost := waiter.Lost()
	token := waiter.Token()
	poller := must(newClient(t, addr).NewMutex(name))
	if !keeps {
		// The hold may run out; nobody else may hold the lock while
		// the waiter's Lost is open.
		got, lostFirst := grab(t, poller, lost, lease+2*time.Second)
		if !lostFirst {
			t.Fatalf("another Client held the lock %v after the release while the waiter's Lost was open", got.Sub(released).Round(time.Millisecond))
		}
		if err := poller.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waiter.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
			t.Errorf("the waiter's Unlock after the loss: %v, want ErrLockLost", err)
		}
		return
	}

	// It keeps the hold for two watchdog leases.
	for end := time.Now().Add(2 * lease); time.Now().Before(end); {
		select {
		case <-lost:
			t.Fatalf("the handed-over hold was lost %v after the release", time.Since(released).Round(time.Millisecond))
		case <-tick.C:
		}
		if ok, err := poller.TryLock(ctx); err != nil || ok {
			t.Fatalf("another Client took the lock %v after the hand-off (err %v)", time.Since(released).Round(time.Millisecond), err)
		}
		if cur, err := admin.HGet(ctx, tokenKey(name), schema.TokenField).Int64(); err != nil || cur != token {
			t.Fatalf("the waiter holds token %d, the lock's latest is %d (err %v): the hold was undone and granted again", token, cur, err)
		}
		if q := queued(t, admin, name); q != 0 {
			t.Fatalf("the waiter holds the lock and %d waiters are queued (requeued?)", q)
		}
	}

	// Its Lost is on time when its connection is cut.
	lostAt := closedAt(lost)
	cut := time.Now()
	px.SetBlackhole(true)
	got, lostFirst := grab(t, poller, lost, lease+2*time.Second)
	if !lostFirst {
		select {
		case la := <-lostAt:
			t.Errorf("another Client held the lock %v after the cut, the waiter's Lost closed %v after the cut", got.Sub(cut).Round(time.Millisecond), la.Sub(cut).Round(time.Millisecond))
		case <-time.After(2 * time.Second):
			t.Errorf("another Client held the lock %v after the cut; the waiter's Lost still open 2s later", got.Sub(cut).Round(time.Millisecond))
		}
	} else {
		la := <-lostAt
		t.Logf("release to waiter's Lock %v; cut to Lost %v, cut to another Client holding it %v",
			r.at.Sub(released).Round(time.Millisecond), la.Sub(cut).Round(time.Millisecond), got.Sub(cut).Round(time.Millisecond))
	}
	if err := poller.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	px.SetBlackhole(false)
	px.ResetAll()
	if err := waiter.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
		t.Errorf("the waiter's Unlock after the loss: %v, want ErrLockLost", err)
	}
}
