package redisync

import (
	"context"
	"testing"
)

// Every primitive's Do releases what it took when fn panics, ends fn's
// context, and lets the panic go on: a panic recovered upstream (as
// net/http recovers a handler's) leaves nothing held.
func TestDoReleasesOnPanic(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	_, nodes, _ := newMiniNodes(t, 3)
	rl := newRedlock(t, nodes)
	for _, tc := range []struct {
		name string
		// do runs fn under the primitive's Do; free reports whether
		// another value can take what Do took.
		do   func(fn func(context.Context) error) error
		free func() (bool, error)
	}{
		{"Mutex", func(fn func(context.Context) error) error {
			return must(c.NewMutex("dopanic-mutex")).Do(ctx, fn)
		}, func() (bool, error) { return tryAndUnlock(must(c.NewMutex("dopanic-mutex"))) }},
		{"RWMutex.Do", func(fn func(context.Context) error) error {
			return must(c.NewRWMutex("dopanic-rw")).Do(ctx, fn)
		}, func() (bool, error) { return tryAndUnlock(must(c.NewRWMutex("dopanic-rw"))) }},
		{"RWMutex.RDo", func(fn func(context.Context) error) error {
			return must(c.NewRWMutex("dopanic-rrw")).RDo(ctx, fn)
		}, func() (bool, error) { return tryAndUnlock(must(c.NewRWMutex("dopanic-rrw"))) }},
		{"Semaphore", func(fn func(context.Context) error) error {
			return must(c.NewSemaphore("dopanic-sem", 2)).Do(ctx, 2, fn)
		}, func() (bool, error) {
			s := must(c.NewSemaphore("dopanic-sem", 2))
			ok, err := s.TryAcquire(ctx, 2)
			if ok {
				err = s.Release(ctx, 2)
			}
			return ok, err
		}},
		{"MultiMutex", func(fn func(context.Context) error) error {
			return must(c.NewMultiMutex([]string{"dopanic-m1", "dopanic-m2"})).Do(ctx, fn)
		}, func() (bool, error) { return tryAndUnlock(must(c.NewMultiMutex([]string{"dopanic-m2", "dopanic-m1"}))) }},
		{"RedMutex", func(fn func(context.Context) error) error {
			return must(rl.NewMutex("dopanic-red")).Do(ctx, fn)
		}, func() (bool, error) { return tryAndUnlock(must(rl.NewMutex("dopanic-red"))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hctx context.Context
			var held bool
			func() {
				defer func() {
					if r := recover(); r != "fn panicked" {
						t.Errorf("recovered %v, want fn's panic", r)
					}
				}()
				_ = tc.do(func(fctx context.Context) error {
					hctx = fctx
					var err error
					if held, err = tc.free(); err != nil {
						t.Errorf("another value's try while Do holds: %v", err)
					}
					panic("fn panicked")
				})
				t.Error("Do returned after fn panicked")
			}()
			if held {
				t.Fatal("another value took what Do held")
			}
			if ok, err := tc.free(); !ok || err != nil {
				t.Errorf("another value's try after Do panicked: %v, %v, want true", ok, err)
			}
			if hctx == nil || hctx.Err() == nil {
				t.Error("fn's context did not end when Do let its panic go on")
			}
		})
	}
}

// tryAndUnlock reports whether l's TryLock took it, releasing it if so.
func tryAndUnlock(l interface {
	TryLock(context.Context) (bool, error)
	Unlock(context.Context) error
}) (bool, error) {
	ok, err := l.TryLock(ctx)
	if ok {
		err = l.Unlock(ctx)
	}
	return ok, err
}
