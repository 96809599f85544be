package redisync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// nameChecker records who is inside each name's critical section: it
// fails when two holders are inside one name at once, or a name's token
// does not exceed the one of the hold before.
type nameChecker struct {
	mu     sync.Mutex
	inside map[string]int   // name -> worker inside; absent: none
	last   map[string]int64 // name -> the last token seen entering
	errs   []error
}

func newNameChecker() *nameChecker {
	return &nameChecker{inside: map[string]int{}, last: map[string]int64{}}
}

// enter records worker w entering names with their tokens.
func (k *nameChecker) enter(w int, tokens map[string]int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, tok := range tokens {
		if v, ok := k.inside[name]; ok {
			k.errs = append(k.errs, fmt.Errorf("%s: worker %d entered while worker %d was inside", name, w, v))
		}
		if tok <= k.last[name] {
			k.errs = append(k.errs, fmt.Errorf("%s: worker %d entered with token %d after %d", name, w, tok, k.last[name]))
		}
		k.inside[name], k.last[name] = w, tok
	}
}

// leave records worker w leaving names.
func (k *nameChecker) leave(w int, tokens map[string]int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name := range tokens {
		if v, ok := k.inside[name]; !ok || v != w {
			k.errs = append(k.errs, fmt.Errorf("%s: worker %d left, but worker %d was inside (%v)", name, w, v, ok))
		}
		delete(k.inside, name)
	}
}

// stormSeed returns the seed of a storm, REDISYNC_MULTI_SEED when set.
func stormSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("REDISYNC_MULTI_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (REDISYNC_MULTI_SEED replays it)", seed)
	return seed
}

// TestMultiMutexStorm is a cancellation storm on a real Redis: 3 Clients,
// 12 workers, 4 names. A third of the workers lock one name with a Mutex,
// the others a MultiMutex of 2 to 4 names given in a random order; half
// the calls have a deadline of 0-5 ms, the others 20 s. It fails if two
// holders are ever inside one name at once or a name's tokens do not
// increase (a per-name interval checker), if a hold is lost, if a call
// fails but for its deadline, or if the workers do not all end within 10
// s of the storm's end (a deadlock between multi-locks that overlap); and
// if it took too few multi-locks, or cancelled too few calls, to prove
// anything.
func TestMultiMutexStorm(t *testing.T) {
	addr := redistest.Addr(t)
	seed := stormSeed(t)
	base := redistest.Name(t)
	names := []string{base + ":a", base + ":b", base + ":c", base + ":d"}
	var clients []*Client
	for range 3 {
		clients = append(clients, newClient(t, redistest.NewClient(t, addr)))
	}
	check := newNameChecker()
	var multis, singles, cancelled, failed atomic.Int64
	var failures sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 12 {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		c := clients[w%len(clients)]
		// A worker's locker: a Mutex of one name, or a MultiMutex of
		// 2 to 4 names in a random order.
		var lock func(context.Context) (map[string]int64, <-chan struct{}, error)
		var unlock func(context.Context) error
		if w%3 == 0 {
			m := must(c.NewMutex(names[rng.IntN(len(names))]))
			lock = func(ctx context.Context) (map[string]int64, <-chan struct{}, error) {
				err := m.Lock(ctx)
				return map[string]int64{m.Name(): m.Token()}, m.Lost(), err
			}
			unlock = m.Unlock
		} else {
			set := rng.Perm(len(names))[:2+rng.IntN(3)]
			var ns []string
			for _, i := range set {
				ns = append(ns, names[i])
			}
			m := must(c.NewMultiMutex(ns))
			lock = func(ctx context.Context) (map[string]int64, <-chan struct{}, error) {
				err := m.Lock(ctx)
				return m.Tokens(), m.Lost(), err
			}
			unlock = m.Unlock
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := 20 * time.Second
				if rng.IntN(2) == 0 {
					d = time.Duration(rng.IntN(5000)) * time.Microsecond
				}
				lctx, cancel := context.WithTimeout(ctx, d)
				tokens, lost, err := lock(lctx)
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					cancelled.Add(1)
					continue
				case err != nil:
					failed.Add(1)
					failures.Store(err.Error(), w)
					continue
				}
				check.enter(w, tokens)
				time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond) // the critical section
				select {
				case <-lost:
					failures.Store(fmt.Sprintf("worker %d lost its hold of %v", w, tokens), w)
					failed.Add(1)
				default:
				}
				check.leave(w, tokens)
				if err := unlock(ctx); err != nil {
					failed.Add(1)
					failures.Store(err.Error(), w)
				}
				if len(tokens) > 1 {
					multis.Add(1)
				} else {
					singles.Add(1)
				}
			}
		}()
	}
	time.Sleep(2 * time.Second) // the storm's length, not a wait for something
	close(stop)
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatalf("workers still running 10 s after the storm ended (deadlock?): %d multi, %d single holds so far",
			multis.Load(), singles.Load())
	}
	t.Logf("%d multi holds, %d single holds, %d calls cancelled", multis.Load(), singles.Load(), cancelled.Load())
	for _, err := range check.errs {
		t.Error(err)
	}
	failures.Range(func(k, v any) bool {
		t.Errorf("worker %v: %v", v, k)
		return true
	})
	if multis.Load() < 50 || singles.Load() < 20 || cancelled.Load() < 50 {
		t.Errorf("the storm proved too little: %d multi holds, %d single, %d cancelled", multis.Load(), singles.Load(), cancelled.Load())
	}
}

// TestMultiMutexNotStarved runs a stream of single-name holders on both
// names of a MultiMutex, from two Clients, each holding 1 ms and taking
// the lock again at once; the MultiMutex, queued fairly on each name, must
// get in within 2 s, three times in a row.
func TestMultiMutexNotStarved(t *testing.T) {
	addr := redistest.Addr(t)
	base := redistest.Name(t)
	names := []string{base + ":a", base + ":b"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var held atomic.Int64
	for w := range 8 {
		c := newClient(t, redistest.NewClient(t, addr))
		m := must(c.NewMutex(names[w%2]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := m.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				held.Add(1)
				time.Sleep(time.Millisecond)
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	eventually(t, 5*time.Second, "the stream to run", func() bool { return held.Load() > 50 })
	m := must(newClient(t, redistest.NewClient(t, addr)).NewMultiMutex(names))
	for range 3 {
		start, before := time.Now(), held.Load()
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := m.Lock(lctx)
		cancel()
		if err != nil {
			t.Fatalf("the MultiMutex did not get in within 2 s (%d single holds meanwhile): %v", held.Load()-before, err)
		}
		t.Logf("in after %v, %d single holds meanwhile", time.Since(start).Round(time.Millisecond), held.Load()-before)
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMultiMutexCrashFreesAll has a holder of a set stop talking to Redis
// (its connection swallowed by a proxy: a crash as others see it) or keep
// a fixed lease it never renews: another Client's MultiMutex of the same
// names gets in within the lease, and, with the watchdog, not before the
// holder's Lost is closed.
func TestMultiMutexCrashFreesAll(t *testing.T) {
	const lease = 500 * time.Millisecond
	for _, tc := range []struct {
		name  string
		opt   Option
		crash bool
	}{
		{"watchdog-crash", WithCrashTimeout(lease), true},
		{"fixed-lease", WithFixedLease(lease), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			px := redistest.NewProxy(t, addr)
			base := redistest.Name(t)
			names := []string{base + ":a", base + ":b", base + ":c"}
			holder := must(newClient(t, redistest.NewClient(t, px.Addr)).NewMultiMutex(names, tc.opt))
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			lost := holder.Lost()
			other := must(newClient(t, redistest.NewClient(t, addr)).NewMultiMutex([]string{names[2], names[0], names[1]}))
			start := time.Now()
			if tc.crash {
				px.SetBlackhole(true)
			}
			lctx, cancel := context.WithTimeout(ctx, lease+3*time.Second)
			defer cancel()
			if err := other.Lock(lctx); err != nil {
				t.Fatalf("the names were not freed within the lease: %v", err)
			}
			took := time.Since(start)
			select {
			case <-lost:
			default:
				if tc.crash {
					t.Fatal("another Client holds the set while the holder's Lost is still open")
				}
			}
			t.Logf("other got in after %v (lease %v)", took.Round(time.Millisecond), lease)
			if took > lease+time.Second {
				t.Errorf("other got in after %v, want within the lease %v", took, lease)
			}
			if err := other.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			px.SetBlackhole(false)
			uctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if err := holder.Unlock(uctx); !errors.Is(err, ErrLockLost) {
				t.Errorf("holder's Unlock: %v, want ErrLockLost", err)
			}
		})
	}
}

// TestMultiMutexLeaseRunsOutWhileWaiting has a MultiMutex under a fixed
// lease wait for its second name longer than the lease: its hold of the
// first name is lost meanwhile. Lock must not return a set with a lost
// name: it gives back what it holds and takes the set anew.
func TestMultiMutexLeaseRunsOutWhileWaiting(t *testing.T) {
	c := newClient(t, redistest.Client(t))
	base := redistest.Name(t)
	m := must(c.NewMultiMutex([]string{base + ":a", base + ":b"}, WithFixedLease(500*time.Millisecond)))
	other := must(c.NewMutex(m.Names()[1]))
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }()
	rdb := redistest.Client(t)
	k := schema.LockKeys(schema.DefaultPrefix, m.Names()[0])
	eventually(t, 5*time.Second, "the first name taken", func() bool { return serverLockHeld(t, rdb, k) })
	st, _ := serverLockState(t, rdb, k)
	first := st.Token
	eventually(t, 5*time.Second, "the first name's fixed lease to run out", func() bool { return !serverLockHeld(t, rdb, k) })
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Lost():
		t.Fatal("Lock returned a set whose hold is lost")
	default:
	}
	if tok := m.TokenOf(m.Names()[0]); tok <= first {
		t.Errorf("the first name's token %d, want a new one above %d", tok, first)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMultiMutexLateReplyUndone delays Redis's replies to a holder past
// its Lock's deadline: the one-call take of the free set runs in Redis,
// the call gives up on it, and the reply, when it comes, has the names
// withdrawn: none stays held (they would stay a whole lease otherwise).
func TestMultiMutexLateReplyUndone(t *testing.T) {
	addr := redistest.Addr(t)
	px := redistest.NewProxy(t, addr)
	rdb := redistest.Client(t)
	c := newClient(t, redistest.NewClient(t, px.Addr))
	base := redistest.Name(t)
	m := must(c.NewMultiMutex([]string{base + ":a", base + ":b"}))
	if err := m.Lock(ctx); err != nil { // loads the scripts
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The take mints a token for each name; the undoing leaves them free.
	tokens := func() (int64, int64) {
		a, _ := serverLockState(t, rdb, m.keys[0])
		b, _ := serverLockState(t, rdb, m.keys[1])
		return a.Token, b.Token
	}
	a0, b0 := tokens()
	px.DelayReplies(200 * time.Millisecond)
	lctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := m.Lock(lctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock: %v, want its deadline", err)
	}
	held := func() bool { return serverLockHeld(t, rdb, m.keys[0]) || serverLockHeld(t, rdb, m.keys[1]) }
	eventually(t, 5*time.Second, "the late take to run", func() bool {
		a, b := tokens()
		return a > a0 && b > b0
	})
	eventually(t, 5*time.Second, "the late take to be undone", func() bool { return !held() })
	px.DelayReplies(0)
	if m.Lost() != notHeld {
		t.Error("the MultiMutex holds a set after its Lock failed")
	}
}
