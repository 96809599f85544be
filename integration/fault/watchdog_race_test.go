package fault

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// No data race between the watchdog's renewals and holders
// re-entering or partly releasing (run with -race; without it this test
// cannot fail). Several holders on one Client share its watchdog, so
// that its batches and their re-arms interleave often.
func TestWatchdogDeadlineUnderRace(t *testing.T) {
	const lease, run, holders = 30 * time.Millisecond, 2 * time.Second, 8
	for _, tc := range []struct {
		name string
		// hold takes a base hold and returns step, which re-enters (or
		// takes one more permit) and leaves once, and done, which lets
		// the base hold go.
		hold func(c *redisync.Client, name string) (step func() error, done func(), err error)
	}{
		{"mutex", func(c *redisync.Client, name string) (func() error, func(), error) {
			m := must(c.NewMutex(name))
			err := m.Lock(ctx)
			hctx, cancel := m.HoldContext(ctx)
			step := func() error {
				if err := m.Lock(hctx); err != nil { // re-entered
					return err
				}
				return m.Unlock(hctx)
			}
			return step, func() { cancel(); _ = m.Unlock(ctx) }, err
		}},
		{"semaphore", func(c *redisync.Client, name string) (func() error, func(), error) {
			s := must(c.NewSemaphore(name, 2))
			step := func() error {
				if err := s.Acquire(ctx, 1); err != nil {
					return err
				}
				return s.Release(ctx, 1)
			}
			return step, func() { _ = s.Release(ctx, s.Held()) }, s.Acquire(ctx, 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			c := newClient(t, addr, redisync.WithCrashTimeout(lease))
			name := redistest.Name(t)
			var steps, losses atomic.Int64
			errs := make(chan error, holders)
			var wg sync.WaitGroup
			for h := range holders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					hname := name + "-" + strconv.Itoa(h)
					step, done, err := tc.hold(c, hname)
					defer func() { done() }()
					rng := rand.New(rand.NewPCG(12, uint64(h)))
					for end := time.Now().Add(run); err == nil && time.Now().Before(end); {
						// A random pause of 0-12 ms between steps (the
						// schedule that makes renewals and re-arms
						// interleave).
						time.Sleep(time.Duration(rng.IntN(13)) * time.Millisecond)
						if err = step(); errors.Is(err, redisync.ErrLockLost) {
							// A 30 ms lease can run out under -race:
							// start over.
							losses.Add(1)
							done()
							step, done, err = tc.hold(c, hname)
						} else if err == nil {
							steps.Add(1)
						}
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			t.Logf("%d re-entries, %d lost holds", steps.Load(), losses.Load())
		})
	}
}
