package integration

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// rwCS counts the readers and writers inside one read-write lock's
// critical section, and the times its rule was broken.
type rwCS struct{ readers, writers, violations atomic.Int64 }

func (c *rwCS) enter(write bool) {
	if write {
		if c.writers.Add(1) != 1 || c.readers.Load() != 0 {
			c.violations.Add(1)
		}
	} else if c.readers.Add(1); c.writers.Load() != 0 {
		c.violations.Add(1)
	}
}

func (c *rwCS) leave(write bool) {
	if write {
		c.writers.Add(-1)
	} else {
		c.readers.Add(-1)
	}
}

// testClusterRWMutex contends for read-write locks whose slots are on
// every primary (each one's keys, token counter and grant channels in its
// slot, grants through sharded pub/sub), one write in four, and then
// checks on each that readers share it and a writer excludes them.
func testClusterRWMutex(t *testing.T, c *redistest.Cluster) {
	cs := clusterClients(t, c, 3, redisync.WithCrashTimeout(300*time.Millisecond))
	admin := c.NewClient(t)
	names := namesOnEveryPrimary(t, c, admin, 3)
	ins := make([]rwCS, len(names))
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 24 {
		k := i % len(names)
		rw := must(cs[i%3].NewRWMutex(names[k]))
		wg.Go(func() {
			for j := range 8 {
				write := (i+j)%4 == 0
				lock, unlock := rw.RLock, rw.RUnlock
				if write {
					lock, unlock = rw.Lock, rw.Unlock
				}
				if err := lock(ctx); err != nil {
					errs <- err
					return
				}
				if write && rw.Token() <= 0 {
					t.Errorf("a write without a token on %s", names[k])
				}
				ins[k].enter(write)
				time.Sleep(2 * time.Millisecond) // the work
				ins[k].leave(write)
				if err := unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range ins {
		if n := ins[k].violations.Load(); n > 0 {
			t.Fatalf("rwmutex %s: a reader beside a writer, or two writers, %d times", names[k], n)
		}
	}
	for _, name := range names {
		r1, r2, w := must(cs[0].NewRWMutex(name)), must(cs[1].NewRWMutex(name)), must(cs[2].NewRWMutex(name))
		for _, r := range []*redisync.RWMutex{r1, r2} {
			if ok, err := r.TryRLock(ctx); !ok || err != nil {
				t.Fatalf("rwmutex %s: TryRLock: %v, %v", name, ok, err)
			}
		}
		if ok, err := w.TryLock(ctx); ok || err != nil {
			t.Fatalf("rwmutex %s: TryLock beside readers: %v, %v", name, ok, err)
		}
		for _, r := range []*redisync.RWMutex{r1, r2} {
			if err := r.RUnlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if ok, err := w.TryLock(ctx); !ok || err != nil {
			t.Fatalf("rwmutex %s: TryLock of a free lock: %v, %v", name, ok, err)
		}
		if ok, err := r1.TryRLock(ctx); ok || err != nil {
			t.Fatalf("rwmutex %s: TryRLock beside a writer: %v, %v", name, ok, err)
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
