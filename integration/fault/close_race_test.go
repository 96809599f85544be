package fault

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// A Lock or Acquire that loses a race with Client.Close
// returns ErrClosed and leaves no hold in Redis (deterministic: its
// request is held on the wire until Close has returned).
func TestLockRacingCloseReturnsErrClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  func(name string) string
		call func(c *redisync.Client, name string) (func() error, func() <-chan struct{})
	}{
		{"mutex", lockKey, func(c *redisync.Client, name string) (func() error, func() <-chan struct{}) {
			m := must(c.NewMutex(name))
			return func() error { return m.Lock(ctx) }, m.Lost
		}},
		{"semaphore", semKey, func(c *redisync.Client, name string) (func() error, func() <-chan struct{}) {
			s := must(c.NewSemaphore(name, 1))
			return func() error { return s.Acquire(ctx, 1) }, s.Lost
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			rdb := redistest.NewClient(t, addr)
			px := redistest.NewProxy(t, addr)
			name := redistest.Name(t)
			key := tc.key(name)
			t.Cleanup(func() { rdb.Del(ctx, key, key+":token", key+":expiry", key+":size") })
			c := proxiedClient(t, px, nil) // default 15 s lease: a leftover shows
			call, lost := tc.call(c, name)

			held, release := px.HoldNext(strings.ToLower(key))
			defer release()
			done := make(chan error, 1)
			go func() { done <- call() }()
			select {
			case <-held:
			case <-time.After(5 * time.Second):
				t.Fatal("the call's request never reached the proxy")
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			release() // the request reaches Redis after Close returned
			err := within(t, 10*time.Second, "the call", func() error { return <-done })
			if !errors.Is(err, redisync.ErrClosed) {
				t.Errorf("the call sent before Close and answered after it returned %v (Lost closed: %v), want ErrClosed",
					err, isClosed(lost()))
			}
			if !goneWithin(t, rdb, key, time.Second) {
				t.Errorf("the call that lost the race with Close left a hold in Redis (%s, %s)", key, holdLeft(t, rdb, key))
			}
		})
	}
}

// With many calls: Locks racing Close either returned nil before Close
// returned, or return ErrClosed and leave no hold.
func TestLockRacingCloseStress(t *testing.T) {
	const goroutines, rounds = 32, 5
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	seed := uint64(9)
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d", seed)
	var bad []string
	for round := range rounds {
		c, err := redisync.New(redistest.NewClient(t, addr)) // default 15 s lease: a leftover shows
		if err != nil {
			t.Fatal(err)
		}
		prefix := redistest.Name(t)
		type outcome struct {
			name string
			err  error
			at   time.Time
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var outs []outcome
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					name := fmt.Sprintf("%s-%d-%d", prefix, g, i)
					err := must(c.NewMutex(name)).Lock(ctx)
					mu.Lock()
					outs = append(outs, outcome{name, err, time.Now()})
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
		// Let the Locks run for a while before Close (a deliberate pause).
		time.Sleep(time.Duration(2+rng.IntN(10)) * time.Millisecond)
		_ = c.Close()
		closed := time.Now()
		wg.Wait()
		late, leftovers := 0, 0
		for _, o := range outs {
			switch {
			case o.err == nil && o.at.After(closed):
				late++
			case errors.Is(o.err, redisync.ErrClosed):
				if heldOn(t, rdb, lockKey(o.name)) {
					leftovers++
				}
			case o.err != nil:
				bad = append(bad, fmt.Sprintf("round %d: Lock: %v", round, o.err))
			}
		}
		if late > 0 || leftovers > 0 {
			bad = append(bad, fmt.Sprintf("round %d: %d Locks returned nil after Close had returned; %d returned ErrClosed and left a hold",
				round, late, leftovers))
		}
		t.Logf("round %d: %d Locks", round, len(outs))
		keys, _ := rdb.Keys(ctx, "redisync:lock:{"+globEscape(prefix)+"*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("Lock racing Close:\n%s", strings.Join(bad, "\n"))
	}
}
