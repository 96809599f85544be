package redisync

import (
	"context"
	"errors"
	"testing"
	"time"
)

// passedCtx is a context whose deadline has passed but which has not been
// told yet: on a loaded machine, the timer that ends a context fires late,
// and a reply can arrive in between.
type passedCtx struct{ context.Context }

func (passedCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A blocking call whose first attempt fails once its context's deadline
// has passed, though before the context is told, returns the deadline's
// error, not Redis's (here: every command fails). Seen in
// TestLockSet: a Lock called during a partition returned EOF 16 ms after
// its deadline.
func TestCallAfterTheDeadlineFailsWithTheDeadline(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	mr.SetError("ERR injected")
	ctx := passedCtx{context.Background()}
	calls := map[string]func() error{
		"Mutex.Lock":       func() error { return c.NewMutex("m").Lock(ctx) },
		"Mutex.Lock barge": func() error { return c.NewMutex("m", Barging()).Lock(ctx) },
		"Semaphore":        func() error { return c.NewSemaphore("s", 2).Acquire(ctx, 1) },
		"RWMutex.RLock":    func() error { return c.NewRWMutex("rw").RLock(ctx) },
		"MultiMutex.Lock":  func() error { return c.NewMultiMutex([]string{"a", "b"}).Lock(ctx) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%v, want context.DeadlineExceeded", err)
			}
		})
	}
}
