package redisync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

var ctx = context.Background()

func TestMutexInvalidInputFailsBeforeRedis(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	cases := []struct {
		name string
		err  error // NewMutex's
		want error
	}{
		{"empty name", errOf(c.NewMutex("")), ErrInvalidName},
		{"long name", errOf(c.NewMutex(strings.Repeat("x", MaxNameLen+1))), ErrInvalidName},
		{"name without a hash tag", errOf(c.NewMutex("}a")), ErrInvalidName},
		{"zero lease", errOf(c.NewMutex("a", WithFixedLease(0))), ErrInvalidOption},
		{"negative lease", errOf(c.NewMutex("a", WithFixedLease(-time.Second))), ErrInvalidOption},
		{"huge lease", errOf(c.NewMutex("a", WithFixedLease(MaxLease+1))), ErrInvalidOption},
		{"tiny watchdog lease", errOf(c.NewMutex("a", WithCrashTimeout(2*time.Millisecond))), ErrInvalidOption},
		{"zero heartbeat", errOf(c.NewMutex("a", WithWaiterTimeout(0))), ErrInvalidOption},
		{"zero recheck", errOf(c.NewMutex("a", WithRecheck(0))), ErrInvalidOption},
		{"negative max hold", errOf(c.NewMutex("a", WithMaxHold(-time.Second))), ErrInvalidOption},
		{"negative max waiters", errOf(c.NewMutex("a", WithMaxWaiters(-1))), ErrInvalidOption},
		{"empty label", errOf(c.NewMutex("a", WithLabel(""))), ErrInvalidOption},
		{"label with a space", errOf(c.NewMutex("a", WithLabel("web 3"))), ErrInvalidOption},
		{"label with a brace", errOf(c.NewMutex("a", WithLabel("web{3}"))), ErrInvalidOption},
		{"label not ASCII", errOf(c.NewMutex("a", WithLabel("wéb"))), ErrInvalidOption},
		{"long label", errOf(c.NewMutex("a", WithLabel(strings.Repeat("x", MaxLabelLen+1)))), ErrInvalidOption},
		{"prefix with brace", errOf(c.NewMutex("a", WithKeyPrefix("p{"))), ErrInvalidOption},
		{"empty prefix", errOf(c.NewMutex("a", WithKeyPrefix(""))), ErrInvalidOption},
		{"zero replicas", errOf(c.NewMutex("a", WithReplicas(0, time.Second))), ErrInvalidOption},
		{"zero replica timeout", errOf(c.NewMutex("a", WithReplicas(1, 0))), ErrInvalidOption},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkInvalid(t, tc.err, tc.want) })
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	m := must(c.NewMutex("a"))
	if err := m.Lock(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("Lock with an ended ctx: %v", err)
	}
	if ok, err := m.TryLock(cancelled); ok || !errors.Is(err, context.Canceled) {
		t.Errorf("TryLock with an ended ctx: %v, %v", ok, err)
	}
	// Unlock is not refused for an ended ctx: it releases what is held,
	// here nothing.
	if err := m.Unlock(cancelled); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Unlock with an ended ctx: %v", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands reached Redis, want 0", n)
	}
}

func TestMutexReentrantCountsAndToken(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMutex("re"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	id := m.holdID()
	if got := holdIDs(t, mr, "redisync:lock:{re}"); len(got) != 1 || got[0] != id {
		t.Fatalf("the lock's holder in Redis is %q, want %q", got, id)
	}
	sent := cnt.n.Load()
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	for i := 2; i <= 3; i++ {
		if err := m.Lock(hctx); err != nil {
			t.Fatal(err)
		}
	}
	if cnt.n.Load() != sent {
		t.Fatalf("re-entering sent %d commands, want none", cnt.n.Load()-sent)
	}
	token := m.Token()
	if token <= 0 {
		t.Fatalf("first hold's token is %d", token)
	}
	if ok, err := must(c.NewMutex("re")).TryLock(ctx); ok || err != nil {
		t.Fatalf("another owner's TryLock on a held lock: %v, %v", ok, err)
	}
	for i := 3; i >= 1; i-- {
		if m.Token() != token {
			t.Fatalf("re-entry changed the token: %d, want %d", m.Token(), token)
		}
		if i > 1 && !lockHeld(t, mr, "redisync:lock:{re}") {
			t.Fatalf("the lock was released with %d levels still held", i)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if lockHeld(t, mr, "redisync:lock:{re}") {
		t.Fatal("lock key still exists after the last Unlock")
	}
	if m.Token() != 0 || m.Lost() != notHeld {
		t.Fatal("Token/Lost should report no hold after the last Unlock")
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Unlock of a free lock: %v, want ErrNotHeld", err)
	}
	if err := m.Lock(ctx); err != nil || m.Token() <= token {
		t.Fatalf("second hold: %v, token %d, want more than %d", err, m.Token(), token)
	}
	if m.holdID() == id {
		t.Fatal("the second hold is stored under the first one's ticket")
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A lock's state of the wrong type, or that redisync did not write, fails
// every call before it writes anything; so does a layout 2 token counter
// that is not one (read once, when the state is made).
func TestMutexWrongTypeIsAnErrorAndWritesNothing(t *testing.T) {
	for _, bad := range []string{"list", "end", "token"} {
		t.Run(bad, func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			c := newClient(t, rdb)
			key := "redisync:lock:{wt}"
			switch bad {
			case "list":
				mr.Lpush(key, "x")
			case "end":
				mr.HSet(key, schema.LayoutField, "3", schema.OwnerField, "a/b-1", schema.EndField, "soon")
			case "token":
				if err := mr.Set(key+":token", "x"); err != nil {
					t.Fatal(err)
				}
			}
			before := mr.Dump()
			m := must(c.NewMutex("wt"))
			if err := m.Lock(ctx); !errors.Is(err, ErrWrongType) {
				t.Fatalf("Lock: %v, want ErrWrongType", err)
			}
			if ok, err := m.TryLock(ctx); ok || !errors.Is(err, ErrWrongType) {
				t.Fatalf("TryLock: %v, %v, want ErrWrongType", ok, err)
			}
			if m.Token() != 0 {
				t.Fatal("a failed Lock left a hold")
			}
			if after := mr.Dump(); after != before {
				t.Fatalf("a failed Lock wrote:\n%s\nthen\n%s", before, after)
			}
		})
	}
}

// A queue (fair) or a record of plain waiters (barging) of the wrong type
// fails a Lock that finds the lock held by another at once, writing
// nothing to the lock: it does not wait behind the holder.
func TestMutexWrongTypeQueueFailsAWaiterAtOnce(t *testing.T) {
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			c := newClient(t, rdb)
			var o []Option
			bad := "redisync:lock:{wtt}:waiting"
			if !fair {
				o = append(o, Barging())
				bad = "redisync:lock:{wtt}:bargers"
			}
			holder := must(c.NewMutex("wtt", o...))
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := mr.Set(bad, "x"); err != nil {
				t.Fatal(err)
			}
			before := lockState(t, mr, "redisync:lock:{wtt}")
			w := must(c.NewMutex("wtt", o...))
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := w.Lock(lctx); !errors.Is(err, ErrWrongType) || lctx.Err() != nil {
				t.Fatalf("Lock: %v (ctx: %v), want ErrWrongType at once", err, lctx.Err())
			}
			if after := lockState(t, mr, "redisync:lock:{wtt}"); after.Queue != before.Queue || after.Owner != before.Owner {
				t.Fatalf("the waiter changed the lock: %+v, then %+v", before, after)
			}
		})
	}
}

// A release whose hand-off meets a queue of the wrong type fails, and
// changes nothing: the holder still holds.
func TestMutexReleaseMeetingWrongTypeChangesNothing(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMutex("wtq"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	key := "redisync:lock:{wtq}"
	mr.HSet(key, schema.QueueField, "2") // waiters, the lock says
	if err := mr.Set(key+":waiting", "x"); err != nil {
		t.Fatal(err)
	}
	before := mr.Dump()
	if err := m.Unlock(ctx); !errors.Is(err, ErrWrongType) {
		t.Fatalf("Unlock: %v, want ErrWrongType", err)
	}
	if after := mr.Dump(); after != before {
		t.Fatalf("the failed release wrote:\n%s\nthen\n%s", before, after)
	}
}

func TestMutexRetriedScriptsDoNotDoubleApply(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMutex("retry"))
	key := "redisync:lock:{retry}"

	cnt.armReplay(acquireScript)
	st := lockState(t, mr, key)
	if err := m.Lock(ctx); err != nil || m.Token() <= 0 {
		t.Fatalf("replayed acquire: %v, token %d", err, m.Token())
	}
	if st = lockState(t, mr, key); st.Owner != m.holdID() || st.Token != m.Token() {
		t.Fatalf("replayed acquire: owner %q, last token %d; want %q, %d (one token minted)", st.Owner, st.Token, m.holdID(), m.Token())
	}
	cnt.armReplay(releaseScript)
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("replayed release: %v, want nil", err)
	}
	if lockHeld(t, mr, key) {
		t.Fatal("lock still held after the release")
	}
}

func TestMutexLostWhenKeyRemoved(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithCrashTimeout(30*time.Millisecond))
	m := must(c.NewMutex("lost"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := m.Lost()
	mr.Del("redisync:lock:{lost}")
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after the key was removed")
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock after loss: %v, want ErrLockLost", err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second Unlock after loss: %v, want ErrNotHeld", err)
	}
}

// TestMutexLostHoldOwesItsUnlocks: a hold lost with two levels is the
// value's until both Unlocks (each ErrLockLost); then Lock and TryLock
// take a new hold, with a larger token and a Lost channel of its own.
func TestMutexLostHoldOwesItsUnlocks(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// The loss is seen within a third of the lease; the new hold must
	// outlive the watchdog's pauses on a loaded machine.
	c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond))
	m := must(c.NewMutex("again"))
	for _, try := range []func() error{
		func() error { return m.Lock(ctx) },
		func() error {
			ok, err := m.TryLock(ctx)
			if err == nil && !ok {
				err = errors.New("TryLock did not take the free lock")
			}
			return err
		},
	} {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		hctx, cancel := m.HoldContext(ctx)
		if err := m.Lock(hctx); err != nil { // a second level, lost with the hold
			t.Fatal(err)
		}
		cancel()
		lost, token := m.Lost(), m.Token()
		mr.Del("redisync:lock:{again}")
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Fatal("Lost not closed after the key was removed")
		}
		if ok, err := m.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock while the lost hold's Unlocks are owed: %v, %v; want false", ok, err)
		}
		for range 2 {
			if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
				t.Fatalf("an Unlock owed to the lost hold: %v, want ErrLockLost", err)
			}
		}
		if err := try(); err != nil {
			t.Fatalf("Lock once the lost hold was unlocked: %v, want a new hold", err)
		}
		if m.Token() <= token || m.Lost() == lost {
			t.Fatalf("the new hold has token %d (the lost one %d) and the same Lost channel: %v", m.Token(), token, m.Lost() == lost)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock of the new hold: %v", err)
		}
		if lockHeld(t, mr, "redisync:lock:{again}") {
			t.Fatal("the new hold's single Unlock did not release it")
		}
	}
}

func TestMutexUnlockAfterLossLeavesOtherOwnerAlone(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// The default lease: b's hold must not be lost to a renewal delayed by
	// a loaded machine (a 30 ms lease was, once in CI), which this test is
	// not about.
	c := newClient(t, rdb)
	a, b := must(c.NewMutex("steal")), must(c.NewMutex("steal"))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.Del("redisync:lock:{steal}")
	if ok, err := b.TryLock(ctx); !ok || err != nil {
		t.Fatalf("b could not take the freed lock: %v, %v", ok, err)
	}
	if err := a.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("a.Unlock: %v, want ErrLockLost", err)
	}
	if h := holdIDs(t, mr, "redisync:lock:{steal}"); len(h) != 1 || h[0] != b.holdID() {
		t.Fatal("a's Unlock touched b's hold")
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestFixedLeaseLostAtDeadline(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := must(c.NewMutex("fixed", WithFixedLease(50*time.Millisecond)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if st := lockState(t, mr, "redisync:lock:{fixed}"); st.End-serverMS(t, mr) > 50 {
		t.Fatalf("lease ends in %d ms, want at most 50", st.End-serverMS(t, mr))
	}
	select {
	case <-m.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed when the fixed lease ran out")
	}
}

func TestCloseEndsWaitersAndHolds(t *testing.T) {
	_, rdb, _ := newMini(t)
	c, err := New(rdb, withHooksOf(rdb), WithRecheck(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	holder, waiter := must(c.NewMutex("close")), must(c.NewMutex("close"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- waiter.Lock(ctx) }()
	eventually(t, 5*time.Second, "the waiter to subscribe", func() bool { return confirmedWaiters(c, waiter.post().channel) == 1 })
	lost := holder.Lost()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting Lock after Close: %v, want ErrClosed", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("a hold's Lost channel is still open after Close")
	}
	if err := holder.Unlock(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Unlock after Close: %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A waiter sleeps without polling and is woken by the Unlock: a fair one
// is handed the lock by the release and returns on its message, with no
// command of its own; a barging one attempts once more.
func TestWaiterWokenByUnlockWithoutPolling(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want int64 // commands from the Unlock to the waiter's return
		why  string
	}{
		{"fair", nil, 1, "the release, which hands the lock over"},
		{"barging", []Option{Barging()}, 2, "release, acquire"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rdb, cnt := newMini(t)
			c := newClient(t, rdb, WithRecheck(time.Hour))
			a, b := must(c.NewMutex("wake", tc.opts...)), must(c.NewMutex("wake", tc.opts...))
			// A first cycle loads the scripts, so that the count below
			// has no EVALSHA answered NOSCRIPT in it.
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			start := cnt.n.Load()
			done := make(chan error, 1)
			go func() { done <- b.Lock(ctx) }()
			// b attempts, subscribes, attempts again once subscribed,
			// then sleeps.
			eventually(t, 5*time.Second, "the waiter to subscribe and look again", func() bool {
				return confirmedWaiters(c, b.post().channel) == 1 && cnt.n.Load()-start == 2
			})
			before := cnt.n.Load()
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter was not woken by the Unlock (recheck is an hour)")
			}
			if n := cnt.n.Load() - before; n != tc.want {
				t.Errorf("Unlock + wake-up took %d commands, want %d (%s)", n, tc.want, tc.why)
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestErrorsAreOneCleanLine(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrWrongType) {
			t.Fatalf("%s: %v, want ErrWrongType", what, err)
		}
		msg := err.Error()
		if strings.ContainsAny(msg, "\r\n") || strings.Contains(msg, "script") || strings.Contains(msg, "traceback") || !strings.Contains(msg, `"wt"`) {
			t.Fatalf("%s: %q is not one clean line naming the lock", what, msg)
		}
	}
	mr.Lpush("redisync:lock:{wt}", "x")
	check("lock hash of the wrong type", must(c.NewMutex("wt")).Lock(ctx))
	mr.Del("redisync:lock:{wt}")
	mr.HSet("redisync:lock:{wt}", schema.LayoutField, "3", schema.TokenField, "1.5")
	err := must(c.NewMutex("wt")).Lock(ctx)
	check("token of 1.5", err)
	if !strings.Contains(err.Error(), "redisync:lock:{wt} does not hold a lock of this layout") {
		t.Fatalf("%q does not say which key holds what", err)
	}
	// Numbers that Lua would read but redisync never writes are not
	// taken for its own: the lease's end of a hold must not count.
	for _, v := range []string{" 99999999999999", "99999999999999 ", "+99999999999999", "1e14", "0x5af3107a3fff", "99999999999999.0"} {
		mr.Del("redisync:lock:{wt}")
		mr.HSet("redisync:lock:{wt}", schema.LayoutField, "3", schema.OwnerField, "other", schema.EndField, v)
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second) // taken for held, Lock would wait
		err := must(c.NewMutex("wt")).Lock(lctx)
		cancel()
		check(fmt.Sprintf("lease end %q", v), err)
	}

	// Any other error of a script, as Redis 7 words it: one line, without
	// the script's SHA and line, and still a redis.Error.
	mr2 := miniredis.RunT(t)
	rdb2 := redis.NewClient(&redis.Options{Addr: mr2.Addr()})
	t.Cleanup(func() { _ = rdb2.Close() })
	hook := &failOnce{msg: "NOPERM this user has no permissions to run the 'time' command script: 6c81b5e1a0f0, on @user_script:75."}
	addHook(rdb2, hook)
	hook.sha.Store(acquireScript.Hash())
	err = must(newClient(t, rdb2).NewMutex("wt")).Lock(ctx)
	var re redis.Error
	if msg := fmt.Sprint(err); !errors.As(err, &re) || strings.Contains(msg, "script") || strings.Contains(msg, "user_script") ||
		!strings.HasSuffix(msg, `"wt": NOPERM this user has no permissions to run the 'time' command`) {
		t.Fatalf("%q is not one clean line naming the lock (or not a redis.Error)", msg)
	}
}

func TestCloseReleasesHolds(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c, err := New(rdb, withHooksOf(rdb))
	if err != nil {
		t.Fatal(err)
	}
	m := must(c.NewMutex("held"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	s := must(c.NewSemaphore("sem", 3))
	if err := s.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	lost, semLost := m.Lost(), s.Lost()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for what, ch := range map[string]<-chan struct{}{"the lock's": lost, "the permits'": semLost} {
		select {
		case <-ch:
		default:
			t.Fatalf("%s Lost is still open after Close", what)
		}
	}
	if lockHeld(t, mr, "redisync:lock:{held}") {
		t.Fatal("Close left the lock held in Redis until its lease runs out")
	}
	if n := holderFields(t, mr, "redisync:sem:{sem}"); len(n) != 0 {
		t.Fatalf("Close left the holders %v in Redis", n)
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Unlock after Close: %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
}

// lostReplyThenRecord makes the next acquire.lua call run and then lose its
// reply (a transient error, as a connection cut after Redis ran it), and
// records the arguments of every acquire.lua call after it.
type lostReplyThenRecord struct {
	passHooks
	mu        sync.Mutex
	armed     bool
	recording bool
	lost      []any // the command whose reply was lost
	after     [][]any
}

func (h *lostReplyThenRecord) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if cmd.Name() != "evalsha" || len(args) < 2 || args[1] != acquireScript.Hash() {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		lose := h.armed
		if h.recording {
			h.after = append(h.after, args)
		}
		if lose {
			h.lost = args
		}
		h.armed, h.recording = false, h.recording || lose
		h.mu.Unlock()
		err := next(ctx, cmd)
		if lose && err == nil {
			err = io.ErrUnexpectedEOF
			cmd.SetErr(err)
		}
		return err
	}
}

// An attempt after one whose reply was lost goes on under a new ticket,
// having withdrawn the old one with a refusal: the lost attempt may have
// queued it under a record the call does not know, and a grant to it,
// delivered late, must not be taken for a grant to the call.
func TestLockAttemptAfterALostReplyGoesOnUnderANewTicket(t *testing.T) {
	mr := miniredis.RunT(t)
	// No retries: the lost reply reaches the call, as once go-redis's
	// retries (or the Client's own, on its connections) are spent.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &lostReplyThenRecord{}
	addHook(rdb, hook)
	c := newClient(t, rdb)
	holder := must(c.NewMutex("m"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	w := must(c.NewMutex("m"))
	l := w.newCall("queue")
	hook.mu.Lock()
	hook.armed = true
	hook.mu.Unlock()
	if _, _, err := l.attempt(ctx); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("attempt: %v, want its lost reply", err)
	}
	k := schema.LockKeys("redisync", "m")
	lost := l.ticket
	if q := queuedTickets(t, mr, k); len(q) != 1 || q[0] != lost {
		t.Fatalf("queue %v, want the ticket that the lost attempt queued", q)
	}
	if _, _, err := l.attempt(ctx); err != nil {
		t.Fatal(err)
	}
	if l.ticket == lost {
		t.Fatal("the attempt after the lost reply kept its ticket")
	}
	if !mr.Exists(k.Tombstone(lost)) {
		t.Fatal("the ticket of the lost attempt is not refused")
	}
	if q := queuedTickets(t, mr, k); len(q) != 1 || q[0] != l.ticket {
		t.Fatalf("queue %v, want the new ticket's record alone", q)
	}
	l.finish(ctx, errors.New("done"))
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if q := queuedTickets(t, mr, k); len(q) != 0 {
		t.Fatalf("queue %v after the release, want the refused record dropped", q)
	}
	if _, err := holder.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
}
