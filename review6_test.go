package redisync

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
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

// Review 6, finding 2: handoff.lua's "take" does not refuse a withdrawn
// ticket, as acquire.lua does. An Accept whose take is held up on a
// stalled connection fails (io.EOF), withdraws its ticket and returns; the
// caller retries Accept with the handle. When the held-up copy arrives
// first, it takes the handle under the withdrawn ticket: the lock is held
// for nobody, nobody renews or releases it, the retry gets ErrNotHeld, and
// the lock stays taken for a whole lease. The late copy of an Accept
// applied where it should take nothing ("leaves nothing behind").
func TestReview6LateAcceptCopyTakesTheHandoffForNobody(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &dropAt{}
	rdb.AddHook(hook)
	c := newClient(t, rdb)
	a, b := c.NewMutex("job"), c.NewMutex("job")
	if err := handoffScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	handle, err := a.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hook.arm(handoffScript)
	if err := b.Accept(ctx, handle); err == nil {
		t.Fatal("Accept succeeded though its take was held up")
	}
	late := hook.copyOf(t)
	ticket := late[8].(string) // evalsha sha 3 lock token tombstone "take" handle ticket lease
	eventually(t, 5*time.Second, "the failed Accept to withdraw its ticket", func() bool {
		v, _ := mr.Get(schema.LockKeys("redisync", "job").Tombstone(ticket))
		return v == "withdrawn"
	})
	if err := rdb.Do(ctx, late...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Accept(ctx, handle); err != nil {
		t.Fatalf("the retried Accept: %v; the lock is held by the withdrawn ticket %s (TTL %v), for nobody",
			err, ticket, mr.TTL("redisync:lock:{job}"))
	}
}

// Review 6, finding 3: Handoff moves the giver's hold to the handle
// without leaving the release tombstone of the giver's ticket, as Unlock
// does since review 5. A late copy of the giver's Lock acquire (held up
// on a stalled connection while go-redis's retry of it went through) that
// arrives after the handed-off hold is done with takes the lock again
// under the giver's ticket: nobody holds it, nobody renews or releases it,
// and the lock stays taken for a whole lease (30 s by default).
func TestReview6LateAcquireCopyAfterHandoffTakesTheLock(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &capture{}
	rdb.AddHook(hook)
	c := newClient(t, rdb)
	a, b, other := c.NewMutex("l"), c.NewMutex("l"), c.NewMutex("l")
	hook.arm(acquireScript)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	late := hook.copyOf(t)
	handle, err := a.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(ctx, late...).Err(); err != nil {
		t.Fatal(err)
	}
	ok, err := other.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("the lock is taken after the hand-off's taker unlocked: a late copy of the giver's acquire holds it (TTL %v), for nobody",
			mr.TTL("redisync:lock:{l}"))
	}
}

// Review 6, finding 4: sem_acquire.lua compares the sizes before it looks
// for a retry of a call that was applied. An Acquire that adds to a
// holding is granted, its reply is lost, and a resize lands before
// go-redis's retry of the identical EVALSHA: the retry answers -2, Acquire
// returns ErrSizeMismatch, and nothing gives the grant back (the call was
// not queued, and the reply was not an error). Redis counts n permits more
// under the holding than s does, and the watchdog renews them with the
// rest for as long as the holding lasts: permits nobody can release.
func TestReview6RetriedAcquireAcrossResizeKeepsPhantomPermits(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &betweenCopies{}
	rdb.AddHook(hook)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	s := c.NewSemaphore("s", 3)
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	hook.arm(semAcquireScript, func() {
		if err := c.ResizeSemaphore(ctx, "s", 3, 4); err != nil {
			t.Error(err)
		}
	})
	// The retry is known as one, and the Acquire succeeds: its grant was
	// made before the resize.
	err := s.Acquire(ctx, 1)
	if err != nil || s.Held() != 2 {
		t.Fatalf("Acquire across the resize: %v, holding %d; want nil, 2", err, s.Held())
	}
	if got := permitsOf(mr, s); got != itoa(s.Held()) && !isClosed(s.Lost()) {
		t.Fatalf("Acquire returned %v; s holds %d with Lost open, Redis counts %s under its holding, renewed by the watchdog", err, s.Held(), got)
	}
}
