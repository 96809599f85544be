package roundtrip

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Detached returns a context for clean-up after ctx ended: it keeps ctx's
// values, not its cancellation.
func Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}

// Ended returns ctx's error once ctx has ended or its deadline has passed.
// On a loaded machine the timer that ends a context fires late: once the
// deadline has passed, ended waits for ctx to be told (at most
// CleanupWait), so that a call that returns after its deadline returns the
// deadline's error, not one that Redis (or the network) gave in between,
// and its caller finds ctx.Err() set. A context that is still not told
// then (one of the caller's own making) gets DeadlineExceeded.
func Ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dl, ok := ctx.Deadline()
	if !ok || time.Now().Before(dl) {
		return nil
	}
	t := time.NewTimer(CleanupWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return context.DeadlineExceeded
	}
}

// GraceEnd returns until when a call whose ctx has ended (or is about to)
// may still wait for Redis: CleanupWait after ctx ended (its deadline, or
// when it was seen cancelled, if it was marked), else CleanupWait from now.
// A call waits for a reply about to arrive and then for its clean-up within
// that one budget.
func GraceEnd(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return dl.Add(CleanupWait)
	}
	if m, ok := ctx.Value(endKey{}).(*atomic.Int64); ok {
		if at := m.Load(); at != 0 {
			return time.Unix(0, at).Add(CleanupWait)
		}
	}
	return time.Now().Add(CleanupWait)
}

// endKey is the context key of the time a marked context ended.
type endKey struct{}

// Marked returns ctx, carrying the time it ends (for GraceEnd) once it
// does, and a function that stops watching it.
func Marked(ctx context.Context) (context.Context, func() bool) {
	if ctx.Done() == nil {
		return ctx, func() bool { return true }
	}
	at := new(atomic.Int64)
	stop := context.AfterFunc(ctx, func() { at.CompareAndSwap(0, time.Now().UnixNano()) })
	return context.WithValue(ctx, endKey{}, at), stop
}

// Releasing returns the context a release waits with: ctx, or, when ctx
// has ended already, or its deadline has passed (a deferred Unlock after a
// timeout; see Ended), one of its own, bounded by CleanupTimeout: a release
// is due whatever ctx says.
func Releasing(ctx context.Context) (context.Context, context.CancelFunc) {
	if Ended(ctx) != nil {
		return Detached(ctx)
	}
	return ctx, func() {}
}
