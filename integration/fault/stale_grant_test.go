package fault

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestFairStaleGrantAfterPause reproduces a violation that TestLockSet
// found: a fair Lock call whose process is paused while the lock is
// handed to it returns, once the process resumes, that grant, although
// its hand-off lease ran out long before and another call holds the lock
// with a higher token.
//
// W, a helper process (fair, heartbeat 1 s, recheck 100 ms), queues behind
// H; X, in this process, queues behind W. W is SIGSTOPped, H unlocks, and
// the release hands the lock to W, whose heartbeat has not run out yet
// (token tW, and a grant message to W's process). W's hand-off lease runs
// out, and X gets the lock (token tX > tW). Then W is resumed. It fails if
// W says "locked" while X still holds the lock. The order in which W's
// process, on resuming, reads the grant message and wakes its waiting call
// is the scheduler's, so the scenario runs up to 8 times.
//
// The cause: when W's waiting call woke before it read the grant message,
// its attempt found the lock held by X and queued the same ticket again,
// which moved the time from which a grant to it was counted past the
// resume; the stale grant message ("ticket:tW"), read next, was adopted as
// if the hand-off had come after that. Fixed by never queueing a ticket
// again once it left the queue: the call goes on under a new ticket, and
// the old one's grant is not addressed to it. On the code before the fix
// it failed within 1-6 trials.
func TestFairStaleGrantAfterPause(t *testing.T) {
	const hb = time.Second
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	queueLen := func() int64 { return rdb.LLen(ctx, lockKey(name)+":waiting").Val() }
	c := newClient(t, addr, redisync.WithWaiterTimeout(hb), redisync.WithCrashTimeout(hb))
	h, x := must(c.NewMutex(name)), must(c.NewMutex(name))
	w := startHolder(t, "serve", "-addr", addr, "-name", name, "-fair",
		"-heartbeat", hb.String(), "-watchdog", hb.String(), "-recheck", "100ms")

	for trial := 1; trial <= 8; trial++ {
		if err := h.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		w.send("lock")
		eventually(t, 5*time.Second, "W queued", func() bool { return queueLen() == 1 })
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		xDone := lockAsync(x, lctx)
		eventually(t, 5*time.Second, "X queued", func() bool { return queueLen() == 2 })

		w.pause()
		if err := h.Unlock(ctx); err != nil { // hands the lock to the paused W
			t.Fatal(err)
		}
		tW := l3bToken(t, rdb, name)
		r := await(t, xDone, 3*hb+5*time.Second, "X, after W's hand-off lease")
		cancel()
		tX := x.Token()
		w.signal(syscall.SIGCONT)
		resumed := time.Now()

		// W may look for a while; it must not believe it holds the lock
		// while X does.
		if l, at, ok := w.next("locked", hb); ok {
			tok, _ := strconv.ParseInt(strings.TrimPrefix(l, "locked "), 10, 64)
			select {
			case <-x.Lost():
			default:
				t.Fatalf("trial %d: W's Lock returned token %d %v after W was resumed, while X holds the lock with token %d "+
					"(taken %v before W was resumed; the lock was handed to W, with token %d, while W was paused)",
					trial, tok, at.Sub(resumed).Round(time.Millisecond), tX, resumed.Sub(r.at).Round(time.Millisecond), tW)
			}
		}
		if err := x.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, _ := w.expect("locked", 5*time.Second)
		if tok, _ := strconv.ParseInt(strings.TrimPrefix(l, "locked "), 10, 64); tok <= tX {
			t.Fatalf("trial %d: W got token %d after X's %d", trial, tok, tX)
		}
		w.send("unlock")
		w.expect("unlocked", 5*time.Second)
		t.Logf("trial %d: W waited its turn (hand-off to the paused W: token %d; X: %d)", trial, tW, tX)
	}
}

// next waits up to d for a line starting with prefix, like expect, but
// reports false instead of failing when none comes.
func (p *proc) next(prefix string, d time.Duration) (string, time.Time, bool) {
	p.t.Helper()
	p.mu.Lock()
	for i, l := range p.seen {
		if strings.HasPrefix(l.text, prefix) {
			p.seen = append(p.seen[:i], p.seen[i+1:]...)
			p.mu.Unlock()
			return l.text, l.at, true
		}
	}
	p.mu.Unlock()
	timeout := time.After(d)
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l.text, prefix) {
				return l.text, l.at, true
			}
			p.mu.Lock()
			p.seen = append(p.seen, l)
			p.mu.Unlock()
		case <-timeout:
			return "", time.Time{}, false
		}
	}
}
