package fault

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestCallsReturnByTheirDeadline: every blocking
// call (Lock, TryLock, Unlock, Acquire, Release) returns by its context's
// deadline plus a small bound (50 ms here), whatever the options of the
// go-redis client, and leaves nothing behind: no hold or permit in memory,
// none in Redis once the connection works again.
//
// The Client talks to Redis through a proxy, on a go-redis client built
// with ContextTimeoutEnabled off (the default: go-redis then ignores
// context deadlines on reads) or on. After a warm-up call (connections
// open, scripts loaded) the proxy blackholes everything, and the call is
// made with a 5 ms deadline. Where this does not hold, the calls wait for
// go-redis's read timeout (3 s), and some then for a clean-up call of
// their own bounded by 5 s, whatever the deadline.
func TestCallsReturnByTheirDeadline(t *testing.T) {
	const (
		deadline = 5 * time.Millisecond
		bound    = 50 * time.Millisecond
	)
	type op struct {
		name  string
		setup func(t *testing.T, c *redisync.Client, name string) (call func(context.Context) error, after func(t *testing.T, admin *redis.Client))
	}
	ops := []op{
		{"Lock", func(t *testing.T, c *redisync.Client, name string) (func(context.Context) error, func(*testing.T, *redis.Client)) {
			m := must(c.NewMutex(name))
			warmMutex(t, m)
			return m.Lock, func(t *testing.T, admin *redis.Client) { mutexLeftNothing(t, admin, m) }
		}},
		{"TryLock", func(t *testing.T, c *redisync.Client, name string) (func(context.Context) error, func(*testing.T, *redis.Client)) {
			m := must(c.NewMutex(name))
			warmMutex(t, m)
			call := func(ctx context.Context) error { _, err := m.TryLock(ctx); return err }
			return call, func(t *testing.T, admin *redis.Client) { mutexLeftNothing(t, admin, m) }
		}},
		{"Unlock", func(t *testing.T, c *redisync.Client, name string) (func(context.Context) error, func(*testing.T, *redis.Client)) {
			m := must(c.NewMutex(name))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			return m.Unlock, func(t *testing.T, admin *redis.Client) {
				t.Helper()
				hctx, cancel := m.HoldContext(context.Background())
				defer cancel()
				if m.Token() != 0 || !errors.Is(context.Cause(hctx), redisync.ErrNotHeld) {
					t.Errorf("after a failed Unlock of the last level, the Mutex still holds token %d", m.Token())
				}
			}
		}},
		{"Acquire", func(t *testing.T, c *redisync.Client, name string) (func(context.Context) error, func(*testing.T, *redis.Client)) {
			s := must(c.NewSemaphore(name, 2))
			warmSemaphore(t, s)
			call := func(ctx context.Context) error { return s.Acquire(ctx, 1) }
			return call, func(t *testing.T, admin *redis.Client) { semaphoreLeftNothing(t, admin, s) }
		}},
		{"Release", func(t *testing.T, c *redisync.Client, name string) (func(context.Context) error, func(*testing.T, *redis.Client)) {
			s := must(c.NewSemaphore(name, 2))
			if err := s.Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			call := func(ctx context.Context) error { return s.Release(ctx, 1) }
			return call, func(t *testing.T, admin *redis.Client) {
				t.Helper()
				if s.Held() != 0 {
					t.Errorf("after a failed Release of its last permit, the Semaphore still holds %d", s.Held())
				}
			}
		}},
	}
	for _, ctxTimeouts := range []bool{false, true} {
		for _, o := range ops {
			sub := o.name + "/ctx-timeouts-off"
			if ctxTimeouts {
				sub = o.name + "/ctx-timeouts-on"
			}
			t.Run(sub, func(t *testing.T) {
				addr := redistest.Addr(t)
				admin := redistest.NewClient(t, addr)
				px := redistest.NewProxy(t, addr)
				rdb := redis.NewClient(&redis.Options{Addr: px.Addr, ContextTimeoutEnabled: ctxTimeouts})
				t.Cleanup(func() { _ = rdb.Close() })
				c, err := redisync.New(rdb)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				call, after := o.setup(t, c, redistest.Name(t))

				px.SetBlackhole(true)
				cctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				start := time.Now()
				done := make(chan error, 1)
				go func() { done <- call(cctx) }()
				select {
				case err := <-done:
					took := time.Since(start)
					t.Logf("%s returned after %v: %v", o.name, took.Round(time.Millisecond), err)
					if took > deadline+bound {
						t.Errorf("%s with a %v deadline returned after %v, want <= %v", o.name, deadline, took.Round(time.Millisecond), deadline+bound)
					}
					if err == nil {
						t.Errorf("%s succeeded through a blackhole", o.name)
					}
				case <-time.After(deadline + bound + time.Second):
					t.Errorf("%s with a %v deadline still blocked after %v (want <= %v)", o.name, deadline, time.Since(start).Round(time.Millisecond), deadline+bound)
					// Let it finish, for the checks below and the leak check.
					px.SetBlackhole(false)
					px.ResetAll()
					ended := time.Now()
					select {
					case err := <-done:
						t.Logf("%s returned %v after the blackhole ended: %v", o.name, time.Since(ended).Round(time.Millisecond), err)
					case <-time.After(20 * time.Second):
						t.Fatalf("%s still blocked 20s after the blackhole ended", o.name)
					}
				}
				px.SetBlackhole(false)
				px.ResetAll()
				after(t, admin)
			})
		}
	}
}

// warmMutex opens m's connections and loads its scripts: a TryLock and an
// Unlock.
func warmMutex(t *testing.T, m *redisync.Mutex) {
	t.Helper()
	if ok, err := m.TryLock(ctx); err != nil || !ok {
		t.Fatalf("warm-up TryLock: %v, %v", ok, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// warmSemaphore opens s's connections and loads its scripts.
func warmSemaphore(t *testing.T, s *redisync.Semaphore) {
	t.Helper()
	if ok, err := s.TryAcquire(ctx, 1); err != nil || !ok {
		t.Fatalf("warm-up TryAcquire: %v, %v", ok, err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// mutexLeftNothing checks that m holds nothing, and that the lock is not
// held in Redis once the connection works again.
func mutexLeftNothing(t *testing.T, admin *redis.Client, m *redisync.Mutex) {
	t.Helper()
	if m.Token() != 0 {
		unlockQuietly(m)
		t.Fatalf("the failed call left the Mutex holding token %d", m.Token())
	}
	eventually(t, 7*time.Second, "the lock to be free in Redis", func() bool {
		return !l3bHeld(t, admin, m.Name())
	})
}

// semaphoreLeftNothing checks that s holds nothing, and that no permit is
// held in Redis once the connection works again.
func semaphoreLeftNothing(t *testing.T, admin *redis.Client, s *redisync.Semaphore) {
	t.Helper()
	if s.Held() != 0 {
		t.Fatalf("the failed call left the Semaphore holding %d permits", s.Held())
	}
	key := "redisync:sem:{" + s.Name() + "}"
	eventually(t, 7*time.Second, "no permit held in Redis", func() bool {
		h := admin.HGetAll(ctx, key).Val()
		for _, f := range schema.SemFields {
			delete(h, f)
		}
		return len(h) == 0
	})
}
