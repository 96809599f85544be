package redisync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// span is one hold as its holder saw it: from just after the call that
// granted it returned to just before the call that released it.
type span struct {
	who        string
	start, end time.Time
	token      int64 // 0: none
	read       bool  // a RWMutex's read: reads may overlap each other
}

// holdLog records the holds of one lock and checks them: no two overlap
// (but reads), and tokens strictly increase in the order the holds began.
type holdLog struct {
	mu    sync.Mutex
	spans []span
}

func (l *holdLog) add(s span) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spans = append(l.spans, s)
}

// check fails the test at the first overlap or token out of order, and
// returns the number of holds.
func (l *holdLog) check(t *testing.T) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	spans := slices.Clone(l.spans)
	slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if !b.start.Before(a.end) {
				break
			}
			if !(a.read && b.read) {
				t.Fatalf("two holds overlap: %s [%v, %v] and %s [%v, %v]", a.who, a.start.Format(time.StampMicro),
					a.end.Format(time.StampMicro), b.who, b.start.Format(time.StampMicro), b.end.Format(time.StampMicro))
			}
		}
	}
	var last int64
	for _, s := range spans {
		if s.token == 0 {
			continue
		}
		if s.token <= last {
			t.Fatalf("token %d of %s after token %d: tokens must increase with each hold", s.token, s.who, last)
		}
		last = s.token
	}
	return len(spans)
}

// register is a resource updated read-modify-write under a lock, fenced:
// it refuses a write whose token is below the highest it has seen. Under
// a lock that excludes, no update is lost: its value counts the updates.
type register struct {
	mu      sync.Mutex
	value   int64
	highest int64
}

func (r *register) read() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.value
}

func (r *register) write(token, v int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.highest {
		return fmt.Errorf("write with token %d refused: token %d wrote already", token, r.highest)
	}
	r.highest, r.value = max(r.highest, token), v
	return nil
}

// exclusive is a lock as the sharing tests use it: one value, shared.
type exclusive struct {
	lock   func(context.Context) error
	unlock func(context.Context) error
	token  func() int64
}

// shareValue has workers goroutines share each of values, taking it rounds
// times each and updating the register under it, and checks that no two
// holds overlapped, tokens increased, and no update was lost.
func shareValue(t *testing.T, values []exclusive, workers, rounds int) {
	t.Helper()
	var log holdLog
	var reg register
	var wg sync.WaitGroup
	errs := make(chan error, workers*len(values))
	for v, x := range values {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(v), uint64(w)))
				for range rounds {
					if err := x.lock(ctx); err != nil {
						errs <- err
						return
					}
					s := span{who: fmt.Sprintf("value %d goroutine %d", v, w), start: time.Now(), token: x.token()}
					n := reg.read()
					time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond) // the work
					err := reg.write(s.token, n+1)
					s.end = time.Now()
					log.add(s)
					if err := errors.Join(err, x.unlock(ctx)); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	holds := log.check(t)
	for err := range errs {
		t.Fatal(err)
	}
	if got := reg.read(); got != int64(holds) || holds != len(values)*workers*rounds {
		t.Fatalf("register %d after %d holds (%d expected): updates were lost", got, holds, len(values)*workers*rounds)
	}
}

// TestSharedValueExcludes: goroutines that share one value exclude each
// other, as those of a *sync.Mutex do, on every primitive that excludes;
// two values of two Clients share the lock besides.
func TestSharedValueExcludes(t *testing.T) {
	cs := []*Client{newClient(t, redistest.Client(t)), newClient(t, redistest.Client(t))}
	for _, tc := range []struct {
		name  string
		value func(c *Client, name string) exclusive
	}{
		{"Mutex", func(c *Client, name string) exclusive {
			m := must(c.NewMutex(name))
			return exclusive{m.Lock, m.Unlock, m.Token}
		}},
		{"BargingMutex", func(c *Client, name string) exclusive {
			m := must(c.NewMutex(name, Barging()))
			return exclusive{m.Lock, m.Unlock, m.Token}
		}},
		{"RWMutex", func(c *Client, name string) exclusive {
			rw := must(c.NewRWMutex(name))
			return exclusive{rw.Lock, rw.Unlock, rw.Token}
		}},
		{"MultiMutex", func(c *Client, name string) exclusive {
			m := must(c.NewMultiMutex([]string{name + ":a", name + ":b"}))
			return exclusive{m.Lock, m.Unlock, func() int64 { return m.TokenOf(name + ":a") }}
		}},
		{"Election", func(c *Client, name string) exclusive {
			e := must(c.NewElection(name))
			return exclusive{func(ctx context.Context) error { return e.Campaign(ctx, "v") }, e.Resign, e.Token}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := redistest.Name(t)
			shareValue(t, []exclusive{tc.value(cs[0], name), tc.value(cs[1], name)}, 4, 6)
		})
	}
	t.Run("RedMutex", func(t *testing.T) {
		_, rdbs, _ := newMiniNodes(t, 3)
		name := redistest.Name(t)
		var values []exclusive
		for range 2 {
			// Every node answers in time, on a loaded machine too.
			m := must(newRedlock(t, rdbs, WithNodeTimeout(5*time.Second)).NewMutex(name))
			values = append(values, exclusive{m.Lock, m.Unlock, m.Token})
		}
		shareValue(t, values, 4, 6)
	})
}

// TestSharedValueReadsAndWrites: goroutines sharing one RWMutex value read
// together and write alone, with each other and with another value's.
func TestSharedValueReadsAndWrites(t *testing.T) {
	name := redistest.Name(t)
	rws := []*RWMutex{must(newClient(t, redistest.Client(t)).NewRWMutex(name)), must(newClient(t, redistest.Client(t)).NewRWMutex(name))}
	var log holdLog
	var reg register
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for v, rw := range rws {
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				write := w%3 == 0
				for range 6 {
					lock, unlock := rw.RLock, rw.RUnlock
					if write {
						lock, unlock = rw.Lock, rw.Unlock
					}
					if err := lock(ctx); err != nil {
						errs <- err
						return
					}
					s := span{who: fmt.Sprintf("value %d goroutine %d (write %v)", v, w, write), start: time.Now(), token: rw.Token(), read: !write}
					n := reg.read()
					time.Sleep(200 * time.Microsecond) // the work
					var err error
					if write {
						err = reg.write(s.token, n+1)
					} else if now := reg.read(); now != n {
						err = fmt.Errorf("a read saw the register change from %d to %d", n, now)
					}
					s.end = time.Now()
					if !write {
						s.token = 0 // a read has no token
					}
					log.add(s)
					if err := errors.Join(err, unlock(ctx)); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	log.check(t)
	if got := reg.read(); got != 2*2*6 {
		t.Fatalf("register %d after %d writes: updates were lost", got, 2*2*6)
	}
}

// TestSharedValueKeepsEachCallsPlace: the Lock calls of goroutines that
// share a value queue each in their own arrival order, across processes,
// and each hold gets a token of its own.
func TestSharedValueKeepsEachCallsPlace(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	shared := must(newClient(t, rdb).NewMutex(name))
	other := must(newClient(t, redistest.Client(t)).NewMutex(name))
	if err := shared.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var tokens []int64
	done := make(chan error, 3)
	for i, w := range []struct {
		who string
		m   *Mutex
	}{{"shared 1", shared}, {"other", other}, {"shared 2", shared}} {
		go func() {
			err := w.m.Do(ctx, func(ctx context.Context) error {
				mu.Lock()
				order, tokens = append(order, w.who), append(tokens, w.m.Token())
				mu.Unlock()
				return nil
			})
			done <- err
		}()
		eventually(t, 5*time.Second, w.who+" queued", func() bool { return rdb.LLen(ctx, shared.keys.Queue).Val() == int64(i+1) })
	}
	if err := shared.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(order) != "[shared 1 other shared 2]" {
		t.Fatalf("served %v, want arrival order [shared 1 other shared 2]", order)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens %v: each hold must have a larger one", tokens)
		}
	}
}

// TestReentryFollowsTheHoldsContext: a Do inside a Do of the same value
// re-enters the hold; a Lock without the hold's context waits its turn,
// even in the goroutine that holds, until its ctx ends; TryLock is false.
func TestReentryFollowsTheHoldsContext(t *testing.T) {
	c := newClient(t, redistest.Client(t))
	m := must(c.NewMutex(redistest.Name(t)))
	var inner int64
	err := m.Do(ctx, func(hctx context.Context) error {
		outer := m.Token()
		if err := m.Do(hctx, func(context.Context) error {
			inner = m.Token()
			return nil
		}); err != nil {
			return err
		}
		if inner != outer {
			return fmt.Errorf("the inner Do ran under token %d, the outer under %d: it did not re-enter", inner, outer)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if err := m.Lock(wctx); !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("a Lock without the hold's context while held: %v, want it to wait until its deadline", err)
		}
		if ok, err := m.TryLock(ctx); ok || err != nil {
			return fmt.Errorf("a TryLock without the hold's context while held: %v, %v; want false", ok, err)
		}
		if ok, err := m.TryLock(hctx); !ok || err != nil {
			return fmt.Errorf("a TryLock with the hold's context: %v, %v; want it to re-enter", ok, err)
		}
		return m.Unlock(hctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.Lost() != notHeld || m.Token() != 0 {
		t.Fatal("m still holds after the outer Do")
	}
}

// TestUnlockOfALostHoldSparesTheNextHold: a hold lost before its Unlock
// stays the value's until that Unlock: another goroutine's Lock waits for
// it without taking the lock in Redis meanwhile (which would keep every
// other process out), and that Unlock (ErrLockLost) never releases the
// later hold, which any goroutine may then Unlock.
func TestUnlockOfALostHoldSparesTheNextHold(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond))
	m := must(c.NewMutex(redistest.Name(t)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := m.Token()
	lost := m.Lost()
	if err := rdb.Del(ctx, m.keys.Hash).Err(); err != nil { // lost behind its back
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the hold deleted behind its back was not lost")
	}
	if ok, err := m.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while the lost hold's Unlock is owed: %v, %v; want false", ok, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := m.Lock(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Lock while the lost hold's Unlock is owed: %v, want it to wait until its deadline", err)
	}
	other := must(c.NewMutex(m.name)) // another value is not held up
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("the Unlock of the lost hold: %v, want ErrLockLost", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if tok := m.Token(); tok <= first || !serverLockHeld(t, rdb, m.keys) {
		t.Fatalf("after the lost hold's Unlock: token %d (the lost one's %d), held %v; want the later hold intact",
			tok, first, serverLockHeld(t, rdb, m.keys))
	}
	done := make(chan error, 1)
	go func() { done <- m.Unlock(ctx) }() // any goroutine may unlock
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if serverLockHeld(t, rdb, m.keys) {
		t.Fatal("the later hold is still in Redis after its Unlock")
	}
}

// TestRWMutexSharedValueWaits: on one RWMutex value, a Lock outside a
// read's context waits for that read to end (no ErrUpgrade), a new RLock
// waits behind a queued writer, and TryLock while another goroutine reads
// is false; inside the read's context a Lock is ErrUpgrade at once.
func TestRWMutexSharedValueWaits(t *testing.T) {
	rdb := redistest.Client(t)
	rw := must(newClient(t, rdb).NewRWMutex(redistest.Name(t)))
	wrote, read := make(chan error, 1), make(chan error, 1)
	err := rw.RDo(ctx, func(rctx context.Context) error {
		if err := rw.Lock(rctx); !errors.Is(err, ErrUpgrade) {
			return fmt.Errorf("Lock inside the read's context: %v, want ErrUpgrade", err)
		}
		if ok, err := rw.TryLock(ctx); ok || err != nil {
			return fmt.Errorf("TryLock while another call reads: %v, %v; want false", ok, err)
		}
		go func() {
			err := rw.Lock(ctx)
			if err == nil {
				err = rw.Unlock(ctx)
			}
			wrote <- err
		}()
		queue := rw.keys.Queue
		eventually(t, 5*time.Second, "the writer queued", func() bool { return rdb.ZCard(ctx, queue).Val() == 1 })
		go func() {
			err := rw.RLock(ctx)
			if err == nil {
				err = rw.RUnlock(ctx)
			}
			read <- err
		}()
		eventually(t, 5*time.Second, "the reader queued behind the writer", func() bool { return rdb.ZCard(ctx, queue).Val() == 2 })
		select {
		case err := <-wrote:
			return fmt.Errorf("the writer returned (%v) while a read was held", err)
		case err := <-read:
			return fmt.Errorf("a new reader returned (%v) ahead of the queued writer", err)
		case <-time.After(100 * time.Millisecond):
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Both are served once the read ends: the writer, then the reader.
	if err := errors.Join(<-wrote, <-read); err != nil {
		t.Fatal(err)
	}
}

// A call of a value that queued while another goroutine of the value held
// the lock, whose hold is then lost and whose Unlock is owed, takes
// nothing in Redis while it waits for that Unlock: another process gets
// the lock meanwhile; once the Unlock comes, the waiting call takes the
// lock. Mutex, MultiMutex, RWMutex (a read queued behind a lost write) and
// Election alike.
func TestAQueuedCallOwingAnUnlockHoldsNothing(t *testing.T) {
	type lockable struct {
		lock, unlock func(context.Context) error
		lost         func() <-chan struct{}
	}
	type setup struct {
		mine, other   lockable
		queued, erase func() bool
		// waiter is the goroutine whose call queues; its unlock after it
		// took the lock.
		waiter, waiterUnlock func(context.Context) error
	}
	rdb := redistest.Client(t)
	opts := []Option{WithCrashTimeout(300 * time.Millisecond), WithRecheck(50 * time.Millisecond)}
	for _, tc := range []struct {
		name string
		make func(name string) setup
	}{
		{"Mutex", func(name string) setup {
			m := must(newClient(t, rdb, opts...).NewMutex(name))
			o := must(newClient(t, rdb).NewMutex(name))
			return setup{
				mine:   lockable{m.Lock, m.Unlock, m.Lost},
				other:  lockable{o.Lock, o.Unlock, o.Lost},
				queued: func() bool { return rdb.LLen(ctx, m.keys.Queue).Val() == 1 },
				erase:  func() bool { return rdb.Del(ctx, m.keys.Hash).Val() == 1 },
				waiter: m.Lock, waiterUnlock: m.Unlock,
			}
		}},
		{"MultiMutex", func(name string) setup {
			m := must(newClient(t, rdb, opts...).NewMultiMutex([]string{name + "a", name + "b"}))
			o := must(newClient(t, rdb).NewMultiMutex([]string{name + "a", name + "b"}))
			a, b := schema.LockKeys(schema.DefaultPrefix, name+"a"), schema.LockKeys(schema.DefaultPrefix, name+"b")
			return setup{
				mine:  lockable{m.Lock, m.Unlock, m.Lost},
				other: lockable{o.Lock, o.Unlock, o.Lost},
				// The names are taken in the order of their slots.
				queued: func() bool { return rdb.LLen(ctx, a.Queue).Val()+rdb.LLen(ctx, b.Queue).Val() == 1 },
				erase:  func() bool { return rdb.Del(ctx, a.Hash, b.Hash).Val() == 2 },
				waiter: m.Lock, waiterUnlock: m.Unlock,
			}
		}},
		{"RWMutex", func(name string) setup {
			rw := must(newClient(t, rdb, opts...).NewRWMutex(name))
			o := must(newClient(t, rdb).NewRWMutex(name))
			return setup{
				mine:   lockable{rw.Lock, rw.Unlock, rw.Lost},
				other:  lockable{o.Lock, o.Unlock, o.Lost},
				queued: func() bool { return rdb.ZCard(ctx, rw.keys.Queue).Val() == 1 },
				erase:  func() bool { return rdb.Del(ctx, rw.keys.Hash).Val() == 1 },
				waiter: rw.RLock, waiterUnlock: rw.RUnlock,
			}
		}},
		{"Election", func(name string) setup {
			e := must(newClient(t, rdb, opts...).NewElection(name))
			o := must(newClient(t, rdb).NewElection(name))
			k := schema.ElectionKeys(schema.DefaultPrefix, name)
			campaign := func(e *Election, v string) func(context.Context) error {
				return func(ctx context.Context) error { return e.Campaign(ctx, v) }
			}
			return setup{
				mine:   lockable{campaign(e, "a"), e.Resign, e.Lost},
				other:  lockable{campaign(o, "o"), o.Resign, o.Lost},
				queued: func() bool { return rdb.LLen(ctx, k.Queue).Val() == 1 },
				erase:  func() bool { return rdb.Del(ctx, k.Hash).Val() == 1 },
				waiter: campaign(e, "b"), waiterUnlock: e.Resign,
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.make(redistest.Name(t))
			if err := s.mine.lock(ctx); err != nil { // goroutine A
				t.Fatal(err)
			}
			lost := s.mine.lost()
			got := make(chan error, 1)
			go func() { got <- s.waiter(ctx) }() // goroutine B, queued while A holds
			eventually(t, 5*time.Second, "B queued", s.queued)
			if !s.erase() { // A's hold is lost behind its back; A owes its Unlock
				t.Fatal("nothing to erase")
			}
			select {
			case <-lost:
			case <-time.After(5 * time.Second):
				t.Fatal("A's hold was not found lost")
			}
			// B waits for A's Unlock holding nothing: another process
			// gets the lock meanwhile.
			octx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := s.other.lock(octx); err != nil {
				t.Fatalf("another process, while B waits for the Unlock owed to A's lost hold: %v", err)
			}
			if err := s.other.unlock(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				t.Fatalf("B returned (%v) before A's Unlock", err)
			default:
			}
			if err := s.mine.unlock(ctx); !errors.Is(err, ErrLockLost) {
				t.Fatalf("A's Unlock of its lost hold: %v, want ErrLockLost", err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			if err := s.waiterUnlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
