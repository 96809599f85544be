package redisync

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Review 25 (independent, adversarial, of f755d84). Each test failed on
// f755d84.

// A fair-only channel (no plain waiter ever waited on it): a reconnect
// (confirm of a confirmed channel) wakes its fair waiter and tells unheard
// nothing; nor does the fair waiter when it leaves without using the
// signal (its ctx ended, or the attempt in flight took the lock): no
// wake.lua in a Client that never had a barging waiter.
func TestReview25FairLeaveTellsUnheard(t *testing.T) {
	var unheard []string
	r := newRegistry(func(name string) { unheard = append(unheard, name) })
	fair := newWaitSet()
	r.add(fair, "fair", "f", false)
	r.confirm("fair")
	r.lapse("fair")
	r.confirm("fair") // a reconnect: wakes the fair waiter, tells nobody
	if len(unheard) != 0 {
		t.Fatalf("reconnect told %q", unheard)
	}
	fair.leave(true) // e.g. its ctx ended with the signal unused
	if len(unheard) != 0 {
		t.Errorf("a fair waiter leaving with a reconnect's signal told unheard %q: a wake.lua in a fair-only Client", unheard)
	}
}

// One empty message is passed on once: the plain waiter leaves with it
// (unheard told, the fair waiter woken as a hint), then the fair waiter
// leaves without using it (on f755d84 unheard was told again: two
// wake.lua, two Clients woken, for one release).
func TestReview25OneWakeupPassedOnTwice(t *testing.T) {
	var unheard []string
	r := newRegistry(func(name string) { unheard = append(unheard, name) })
	fair, plain := newWaitSet(), newWaitSet()
	r.add(fair, "mixed", "f", false)
	r.add(plain, "mixed", "p", true)
	r.confirm("mixed")
	r.deliver("mixed", "")
	plain.leave(true)
	fair.leave(false) // its attempt in flight took the lock: signal unused
	if !slices.Equal(unheard, []string{"mixed"}) {
		t.Errorf("one wake-up told unheard %q, want once", unheard)
	}
}

// wakeCounter counts runs of wake.lua.
type wakeCounter struct{ n atomic.Int64 }

func (w *wakeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *wakeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		a := cmd.Args()
		if err == nil && len(a) > 1 && (a[1] == wakeScript.Hash() || a[1] == luaLib+luaWake) {
			w.n.Add(1) // runs answered (not an EVALSHA's NOSCRIPT)
		}
		return err
	}
}
func (w *wakeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Client level: a fair-only Client (default Mutex, no Barging anywhere)
// whose waiter is woken by a reconnect (wakeAll, as registry.missed does)
// as its ctx ends runs no wake.lua.
func TestReview25FairOnlyClientRunsWake(t *testing.T) {
	_, rdb, _ := newMini(t)
	wc := &wakeCounter{}
	rdb.AddHook(wc)
	holder := newClient(t, rdb).NewMutex("g")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	a := newClient(t, rdb)
	name := schema.LockKeys(schema.DefaultPrefix, "g").GrantChannel(a.id)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.NewMutex("g").Lock(wctx) }()
	eventually(t, 5*time.Second, "the fair waiter to subscribe", func() bool { return confirmedWaiters(a, name) == 1 })
	r := a.sub.reg
	r.mu.Lock()
	r.channels[name].wakeAll() // what confirm after a reconnect does
	cancel()
	r.mu.Unlock()
	if err := result(t, done); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	_ = a.Close() // waits for background calls
	if n := wc.n.Load(); n != 0 {
		t.Errorf("a fair-only Client ran wake.lua %d times", n)
	}
}
