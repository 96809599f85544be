package watchdog

import (
	"context"
	"testing"
	"time"
)

// A renewal that answered is never reported as failed: call's goroutine
// used to cancel the call's context as soon as Renew returned, so that a
// caller that reached its select late (a loaded machine) found both the
// reply and the context ended, and picked either: a renewal told failed
// with "context canceled" in a millisecond, its reply dropped (the
// waiters found with nobody to wake them among it, TestLoggerWarnings).
// The window is narrow: many calls are made, the Renew instant, so that
// the reply often comes before the caller's select.
func TestCallKeepsTheReplyOfARenewalThatAnswered(t *testing.T) {
	w := New(context.Background(), Config{Renew: func(ctx context.Context, batch []Renewal) ([]int64, error) {
		return []int64{1, 0}, nil
	}})
	limit := time.Now().Add(time.Hour)
	for i := range 50_000 {
		if res, err := w.call(limit, nil); err != nil || len(res) != 2 {
			t.Fatalf("call %d = %v, %v; want the reply [1 0]", i, res, err)
		}
	}
}
