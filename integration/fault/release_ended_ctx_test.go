package fault

import (
	"context"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// An Unlock or Release whose ctx has already ended must not
// leave the hold registered with the watchdog (renewed forever): the
// release must still reach Redis (detached from ctx, with its own timeout).
func TestReleaseWithEndedCtxReleases(t *testing.T) {
	const lease = 300 * time.Millisecond
	ended, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *redisync.Client, name string) (key string)
	}{
		{"mutex", func(t *testing.T, c *redisync.Client, name string) string {
			m := must(c.NewMutex(name))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("Unlock(ended ctx): %v", m.Unlock(ended))
			return lockKey(name)
		}},
		{"mutex-reentered", func(t *testing.T, c *redisync.Client, name string) string {
			m := must(c.NewMutex(name))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			hctx, hcancel := m.HoldContext(ctx)
			defer hcancel()
			if err := m.Lock(hctx); err != nil { // re-entered
				t.Fatal(err)
			}
			t.Logf("Unlock(ended ctx) of level 2: %v", m.Unlock(ended))
			t.Logf("Unlock(ctx) of level 1: %v", m.Unlock(ctx))
			return lockKey(name)
		}},
		{"semaphore", func(t *testing.T, c *redisync.Client, name string) string {
			s := must(c.NewSemaphore(name, 2))
			if err := s.Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			t.Logf("Release(ended ctx, 1): %v", s.Release(ended, 1))
			return semKey(name)
		}},
		{"semaphore-partial", func(t *testing.T, c *redisync.Client, name string) string {
			s := must(c.NewSemaphore(name, 2))
			if err := s.Acquire(ctx, 2); err != nil {
				t.Fatal(err)
			}
			t.Logf("Release(ended ctx, 1) of 2: %v", s.Release(ended, 1))
			t.Logf("Release(ctx, 1) of the last: %v", s.Release(ctx, 1))
			return semKey(name)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			rdb := redistest.NewClient(t, addr)
			name := redistest.Name(t)
			c := newClient(t, addr, redisync.WithCrashTimeout(lease))
			key := tc.run(t, c, name)
			if !goneWithin(t, rdb, key, 2*lease) {
				t.Fatalf("%s is still held in Redis %v after the release with an ended ctx (%s): the watchdog keeps renewing a hold its owner let go",
					key, 2*lease, holdLeft(t, rdb, key))
			}
		})
	}
}
