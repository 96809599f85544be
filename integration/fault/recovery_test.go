package fault

// Recovery from a slow give-back, a blackholed subscriber and a wake-up
// taken by a call that ends: each test states the interleaving it forces.

import (
	"context"
	"fmt"
	"net"
	"strings"

	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// scriptHook lets a test act on the script calls (FCALL, EVALSHA, EVAL) of
// one go-redis client:
// before is called before a script call is sent, after once its reply is
// in (before the caller sees it). Both get the call's string arguments.
type scriptHook struct {
	before func(args []string)
	after  func(args []string)
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		if name != "fcall" && name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		args := make([]string, 0, len(cmd.Args()))
		for _, a := range cmd.Args() {
			args = append(args, fmt.Sprint(a))
		}
		if h.before != nil {
			h.before(args)
		}
		err := next(ctx, cmd)
		if h.after != nil {
			h.after(args)
		}
		return err
	}
}

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func hasArg(args []string, v string) bool {
	for _, a := range args {
		if a == v {
			return true
		}
	}
	return false
}

// TestRetakeWaitsForOwnGiveBack: a Lock call whose grant arrives after
// its lease may have run out (take: errExpired) gives the hold back with a
// clean-up it waits for at most roundtrip.CleanupWait, then attempts again
// under the SAME ticket. Nothing orders that second attempt after the
// give-back: when the give-back is slower (a slow connection, a go-redis
// retry, jitter), the second attempt takes the lock under the ticket, Lock
// returns success, and then the give-back ("withdraw" of the ticket)
// arrives and deletes the new hold. Another Client then takes the lock
// while the first still holds it with Lost() open: two holders.
//
// Forced here with a hook on the first Client: its first acquire reply is
// delayed past the (fixed) lease; its withdraw is delayed 300 ms before it
// is sent (as a write stuck behind a slow connection would be).
func TestRetakeWaitsForOwnGiveBack(t *testing.T) {
	const lease = 300 * time.Millisecond
	addr := redistest.Addr(t)
	name := redistest.Name(t)

	// Load the scripts first, so that the hooked calls are single EVALSHAs.
	warm := must(newClient(t, addr).NewMutex(name + "-warm"))
	if err := warm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	var acquires atomic.Int32
	hook := &scriptHook{
		before: func(args []string) {
			if args[len(args)-1] == "withdraw" {
				time.Sleep(150 * time.Millisecond)
			}
		},
		after: func(args []string) {
			if hasArg(args, "barge") && acquires.Add(1) == 1 {
				time.Sleep(lease + 100*time.Millisecond) // the reply arrives after the lease
			}
		},
	}
	ardb := redis.NewClient(&redis.Options{Addr: addr})
	ardb.AddHook(hook)
	t.Cleanup(func() { _ = ardb.Close() })
	ac, err := redisync.New(ardb, withHook(hook))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ac.Close() })
	a := must(ac.NewMutex(name, redisync.WithFixedLease(lease), redisync.Barging())) // the hook catches a barging attempt

	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.Lock(lctx); err != nil {
		t.Fatalf("A.Lock: %v", err)
	}
	lockedAt := time.Now()
	t.Logf("A holds token %d after %d acquire calls", a.Token(), acquires.Load())

	b := must(newClient(t, addr).NewMutex(name))
	for time.Since(lockedAt) < lease-20*time.Millisecond {
		ok, err := b.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			select {
			case <-a.Lost():
				t.Logf("B got the lock after A's Lost closed (fine)")
				return
			default:
			}
			t.Fatalf("two holders: B took the lock (token %d) %v after A's Lock returned (token %d), A's Lost() still open",
				b.Token(), time.Since(lockedAt).Round(time.Millisecond), a.Token())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBlackholedSubscriberIsReplaced: the subscriber pings a
// silent pub/sub connection "so that a dead connection is noticed and
// replaced", but PubSub.Ping only writes the PING: its reply is never
// awaited, and read timeouts are not errors. A pub/sub connection that
// stops delivering without an error (a partition or a middlebox that drops
// its state: no RST) is kept for good, while the Client's other
// connections work. Every release message is lost and every waiter of the
// process sleeps to min(PTTL, recheck) each time.
//
// Here the pub/sub connection alone goes through a proxy that is then
// blackholed; the commands go straight to Redis. After 6 s (two pings'
// worth) the holder unlocks: the waiter should be in within a second.
func TestBlackholedSubscriberIsReplaced(t *testing.T) {
	const recheck = 15 * time.Second
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	px := redistest.NewProxy(t, addr)
	var viaProxy atomic.Bool
	wrdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, a string) (net.Conn, error) {
		var d net.Dialer
		if viaProxy.Load() && ctx.Value(ownDial{}) == nil {
			return d.DialContext(ctx, network, px.Addr)
		}
		return d.DialContext(ctx, network, a)
	}})
	t.Cleanup(func() { _ = wrdb.Close() })
	// The Client's own connections, on which its calls go, dial with
	// wrdb's options, Dialer included: marked, they go straight to Redis
	// whenever they dial, so that only the subscriber's goes through the
	// proxy.
	wc, err := redisync.New(wrdb, redisync.WithRecheck(recheck), redisync.WithConnSetup(func(c *redis.Client) error {
		c.AddHook(ownDial{})
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wc.Close() })
	waiter := must(wc.NewMutex(name))
	if err := wrdb.Ping(ctx).Err(); err != nil { // a pooled command connection, direct
		t.Fatal(err)
	}

	holder := must(newClient(t, addr).NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := redistest.NewClient(t, addr)
	viaProxy.Store(true) // the next dial: the subscriber's
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := lockAsync(waiter, lctx)
	eventually(t, 5*time.Second, "the waiter to subscribe", func() bool { return subscribers(t, rdb, name) == 1 })
	viaProxy.Store(false)
	time.Sleep(100 * time.Millisecond)
	px.SetBlackhole(true)
	time.Sleep(6 * time.Second)
	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("waiter in %v after the release", r.at.Sub(released).Round(time.Millisecond))
	case <-time.After(2 * time.Second):
		cancel()
		<-done
		t.Fatalf("waiter still waiting 2 s after the release: the blackholed pub/sub connection (pinged, no reply for 6 s) was never replaced (proxy conns accepted: %d)",
			px.Stats().ConnsAccepted)
	}
	_ = waiter.Unlock(ctx)
}

// ownDial is a go-redis hook that marks the context of its client's dials
// with itself (as a key), for a Dialer to tell them apart.
type ownDial struct{}

func (ownDial) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(context.WithValue(ctx, ownDial{}, true), network, addr)
	}
}

func (ownDial) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (ownDial) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// endingCtx is a context whose Err reports Canceled from the moment end is
// called, as a deadline expiring right then would, while its Done channel
// closes only later (on close): it places the end of ctx exactly between
// two of the library's checks, deterministically.
type endingCtx struct {
	context.Context
	ended atomic.Bool
	done  chan struct{}
}

func newEndingCtx() *endingCtx {
	return &endingCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *endingCtx) Done() <-chan struct{} { return c.done }
func (c *endingCtx) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return nil
}

// TestRedMutexPassesOnAWakeUp: RedMutex.Lock's waitAny consumes the
// signals of its waiters, then the next round fails (here: ctx ended just
// then) and Lock returns without passing the wake-up on, unlike
// Client.block, which nudges and leave()s. The release message woke one
// waiter per process (wakeOne): the other RedMutex waiter of the process
// sleeps to min(PTTL, recheck).
func TestRedMutexPassesOnAWakeUp(t *testing.T) {
	const recheck = 5 * time.Second
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	node := redistest.NewClient(t, addr)
	r, err := redisync.NewRedlock([]redis.UniversalClient{node}, redisync.WithRecheck(recheck))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	x, y := must(r.NewMutex(name)), must(r.NewMutex(name))

	holder := must(newClient(t, addr).NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := redistest.NewClient(t, addr)
	xctx := newEndingCtx()
	xdone := make(chan error, 1)
	go func() { xdone <- x.Lock(xctx) }()
	eventually(t, 5*time.Second, "x to wait", func() bool { return subscribers(t, rdb, name) == 1 })
	time.Sleep(100 * time.Millisecond) // x registered first: the wake-up is x's
	ydone := make(chan result, 1)
	go func() {
		err := y.Lock(ctx)
		ydone <- result{err, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond) // y waits too

	xctx.ended.Store(true) // x's ctx ends: its next check sees it
	released := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-xdone; err == nil {
		t.Fatal("x got the lock")
	}
	close(xctx.done)
	select {
	case res := <-ydone:
		if res.err != nil {
			t.Fatal(res.err)
		}
		t.Logf("y in %v after the release", res.at.Sub(released).Round(time.Millisecond))
	case <-time.After(2 * time.Second):
		res := <-ydone
		t.Fatalf("y got the free lock only %v after the release: x swallowed the process's wake-up", res.at.Sub(released).Round(time.Millisecond))
	}
	_ = y.Unlock(ctx)
}
