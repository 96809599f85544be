package redisync

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Issue 19, point 8: a hold is handed to another process atomically: new
// owner, new fencing token, the old holder's Lost closed, and never two
// holders at once.
func TestMutexHandoff(t *testing.T) {
	mr, rdb, _ := newMini(t)
	ca, cb := newClient(t, rdb), newClient(t, rdb)
	a, b := must(ca.NewMutex("job")), must(cb.NewMutex("job"))
	key := "redisync:lock:{job}"
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := a.HoldContext(ctx)
	defer cancel()
	if err := a.Lock(hctx); err != nil { // re-entered: the whole hold goes
		t.Fatal(err)
	}
	lost, token := a.Lost(), a.Token()
	handle, err := a.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the giver's Lost is open after Handoff returned")
	}
	if a.Token() != 0 || a.Lost() != notHeld {
		t.Fatal("the giver still holds after Handoff")
	}
	if f := holdIDs(t, mr, key); len(f) != 1 || f[0] != handle {
		t.Fatalf("lock fields %q, want the handle %q alone", f, handle)
	}
	if ok, err := must(cb.NewMutex("job")).TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while the hold waits for its taker: %v, %v", ok, err)
	}
	if err := b.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	if b.Token() <= token || b.Lost() == notHeld {
		t.Fatalf("the taker's token %d (giver's %d), Lost %v", b.Token(), token, b.Lost())
	}
	if f := holdIDs(t, mr, key); len(f) != 1 || f[0] != b.holdID() || lockState(t, mr, key).Token != b.Token() {
		t.Fatalf("lock holder %q, want the taker's hold alone with its token", f)
	}
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("the giver's Unlock: %v, want ErrNotHeld", err)
	}
	// A handle is taken once.
	if err := must(ca.NewMutex("job")).Accept(ctx, handle); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("a second Accept: %v, want ErrNotHeld", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if lockHeld(t, mr, key) {
		t.Fatal("the lock is left after the taker's Unlock")
	}
}

func TestMutexHandoffErrors(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb, WithCrashTimeout(200*time.Millisecond))
	m := must(c.NewMutex("job"))
	if _, err := m.Handoff(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Handoff holding nothing: %v, want ErrNotHeld", err)
	}
	if err := m.Accept(ctx, ""); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Accept of an empty handle: %v, want ErrNotHeld", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Fatalf("%d commands reached Redis", n)
	}
	if err := m.Accept(ctx, "no-such-handle"); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Accept of an unknown handle: %v, want ErrNotHeld", err)
	}

	// Accept on a value that holds: refused before Redis, the hold waits.
	giver := must(c.NewMutex("other"))
	if err := giver.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	handle, err := giver.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Accept(ctx, handle); !errors.Is(err, ErrHeld) {
		t.Fatalf("Accept on a holding value: %v, want ErrHeld", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Nobody accepts it in time: it runs out, and the lock is free.
	mr.FastForward(200 * time.Millisecond)
	if err := m.Accept(ctx, handle); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Accept after the hand-off ran out: %v, want ErrNotHeld", err)
	}

	// A lost hold cannot be handed off.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.Del("redisync:lock:{job}")
	eventually(t, 5*time.Second, "the hold to be lost", func() bool { return isClosed(m.Lost()) })
	if _, err := m.Handoff(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Handoff of a lost hold: %v, want ErrLockLost", err)
	}
}

// Both steps are safe to retry: a replayed give or take applies once, and
// the taker's token is the one minted.
func TestMutexHandoffRetried(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	a, b := must(c.NewMutex("job")), must(c.NewMutex("job"))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := handoffScript.Load(ctx, rdb).Err(); err != nil { // so that EVALSHA runs, and is replayed
		t.Fatal(err)
	}
	cnt.armReplay(handoffScript)
	handle, err := a.Handoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cnt.armReplay(handoffScript)
	if err := b.Accept(ctx, handle); err != nil {
		t.Fatal(err)
	}
	key := "redisync:lock:{job}"
	if st := lockState(t, mr, key); st.Owner != b.holdID() || st.Token != b.Token() {
		t.Fatalf("after replays: owner %q, last token %d; the taker's token %d", st.Owner, st.Token, b.Token())
	}
}

// dropAt makes the next EVALSHA of a script fail with io.EOF without
// running it, and keeps a copy of it: the command is held up on a stalled
// connection (go-redis gave up on it), and arrives later.
type dropAt struct {
	passHooks
	mu   sync.Mutex
	sha  string
	args []any
}

func (h *dropAt) arm(s *luaScript) {
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

// Accept takes any hold of the lock, not only one
// that waits for its taker under a hand-off handle: handoff.lua's "take"
// only checks that the handle has a hold count. A hold id is no secret
// (redisync status prints it, it is the holder's label and client id),
// and a handle looks like any other hold id. Accept with the live
// holder's id moves the hold to the taker while the holder still believes
// it holds (its Lost stays open until a renewal fails): two holders at
// once. The doc says Accept returns ErrNotHeld when no hold waits under
// handle ("or never was").
func TestMutexAcceptTakesALiveHold(t *testing.T) {
	_, rdb, _ := newMini(t)
	ca, cb := newClient(t, rdb), newClient(t, rdb)
	a, b := must(ca.NewMutex("job")), must(cb.NewMutex("job"))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	err := b.Accept(ctx, a.holdID()) // not a handle: a's live hold
	if err == nil && !isClosed(a.Lost()) {
		t.Fatalf("Accept of the holder's own id took the lock (b's token %d) while a holds it with Lost open (token %d): two holders", b.Token(), a.Token())
	}
}

// An Accept whose take is held up on a stalled connection fails (io.EOF),
// withdraws its ticket with a refusal and returns; the caller retries
// Accept with the handle. The held-up copy, arriving first, takes nothing:
// taken under the withdrawn ticket, the lock would be held for nobody for
// a whole lease, and the retry would get ErrNotHeld.
func TestMutexLateAcceptCopyIsRefused(t *testing.T) {
	mr := miniredis.RunT(t)
	// No retries: the failure reaches the call, as once go-redis's
	// retries (or the Client's own, on its connections) are spent.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &dropAt{}
	addHook(rdb, hook)
	c := newClient(t, rdb)
	a, b := must(c.NewMutex("job")), must(c.NewMutex("job"))
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
	ticket := late[8].(string) // evalsha sha 3 lock queue tombstone "take" handle ticket lease
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

// A copy of the giver's acquire whose reply was lost (held up on a
// stalled connection) that arrives after the handed-off hold is done with
// takes nothing: the giver's ticket is refused from the hand-off on.
// Taken, the lock would stay held for a whole lease, for nobody.
func TestMutexLateAcquireCopyAfterHandoffIsRefused(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &lostReplyThenRecord{}
	addHook(rdb, hook)
	c := newClient(t, rdb)
	a, b, other := must(c.NewMutex("l")), must(c.NewMutex("l")), must(c.NewMutex("l"))
	if err := other.Lock(ctx); err != nil { // loads the script: EVALSHA finds it
		t.Fatal(err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := a.newCall("barge")
	hook.mu.Lock()
	hook.armed = true
	hook.mu.Unlock()
	if _, _, err := l.attempt(ctx); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("attempt: %v, want its lost reply", err)
	}
	if ok, _, err := l.attempt(ctx); !ok || err != nil {
		t.Fatalf("the attempt after the lost reply: %v, %v; want the lock the lost one took", ok, err)
	}
	hook.mu.Lock()
	late := hook.lost
	hook.mu.Unlock()
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
	res, err := rdb.Do(ctx, late...).Int64Slice()
	if err != nil || res[0] != -2 {
		t.Fatalf("the late copy: %v, %v; want it refused", res, err)
	}
	ok, err := other.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("the lock is taken after the hand-off's taker unlocked: a late copy of the giver's acquire holds it, for nobody")
	}
}
