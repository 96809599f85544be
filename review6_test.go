package redisync

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// dropAt makes the next EVALSHA of a script fail with io.EOF without
// running it, and keeps a copy of it: the command is held up on a stalled
// connection (go-redis gave up on it), and arrives later.
type dropAt struct {
	mu   sync.Mutex
	sha  string
	args []any
}

func (h *dropAt) arm(s *redis.Script) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.args = s.Hash(), nil
}

func (h *dropAt) copyOf(t *testing.T) []any {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.args == nil {
		t.Fatal("nothing held up")
	}
	return append([]any(nil), h.args...)
}

func (h *dropAt) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *dropAt) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *dropAt) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		fire := h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha
		if fire {
			h.sha, h.args = "", append([]any(nil), args...)
		}
		h.mu.Unlock()
		if !fire {
			return next(ctx, cmd)
		}
		cmd.SetErr(io.EOF)
		return io.EOF
	}
}

// betweenCopies runs the next EVALSHA of a script twice, as go-redis does
// when it retries after a lost reply, and runs f in between (another
// process's call that lands between the two copies).
type betweenCopies struct {
	mu  sync.Mutex
	sha string
	f   func()
}

func (h *betweenCopies) arm(s *redis.Script, f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sha, h.f = s.Hash(), f
}

func (h *betweenCopies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *betweenCopies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *betweenCopies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		var f func()
		if h.sha != "" && cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha {
			h.sha, f = "", h.f
		}
		h.mu.Unlock()
		if f == nil {
			return next(ctx, cmd)
		}
		_ = next(ctx, cmd) // it runs; the reply is lost
		f()
		return next(ctx, cmd) // go-redis's retry
	}
}

// Review 6, finding 1: Accept takes any hold of the lock, not only one
// that waits for its taker under a hand-off handle: handoff.lua's "take"
// only checks that the handle has a hold count. A hold id is no secret
// (redisync status prints it, it is the holder's label and client id),
// and a handle looks like any other hold id. Accept with the live
// holder's id moves the hold to the taker while the holder still believes
// it holds (its Lost stays open until a renewal fails): two holders at
// once. The doc says Accept returns ErrNotHeld when no hold waits under
// handle ("or never was").
func TestReview6AcceptTakesALiveHold(t *testing.T) {
	_, rdb, _ := newMini(t)
	ca, cb := newClient(t, rdb), newClient(t, rdb)
	a, b := ca.NewMutex("job"), cb.NewMutex("job")
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	err := b.Accept(ctx, a.holdID()) // not a handle: a's live hold
	if err == nil && !isClosed(a.Lost()) {
		t.Fatalf("Accept of the holder's own id took the lock (b's token %d) while a holds it with Lost open (token %d): two holders", b.Token(), a.Token())
	}
}

