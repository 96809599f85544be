package fault

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/fence"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestHolderSIGKILL kills a holder process (watchdog lease 1 s) while a
// waiter in this process blocks in Lock, and fails unless the waiter
// acquires within lease + 300 ms of the SIGKILL. It would fail if the
// waiter's sleep were not bounded by the lock's PTTL (it would sleep the
// 10 s recheck interval: nobody publishes for a dead holder), or if the
// dead holder's lease were still renewed.
func TestHolderSIGKILL(t *testing.T) {
	const lease = time.Second
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	holder := startHolder(t, "serve", "-addr", addr, "-name", name, "-watchdog", lease.String())
	holder.lockToken(5 * time.Second)

	waiter := must(newClient(t, addr).NewMutex(name))
	done := lockAsync(waiter, ctx)
	eventually(t, 5*time.Second, "the waiter to subscribe", func() bool { return subscribers(t, rdb, name) == 1 })
	// Let a renewal or two happen, so the kill lands at a random point of
	// the lease (a deliberate pause, not a wait for a condition).
	time.Sleep(lease / 2)

	killed := time.Now()
	holder.kill()
	r := await(t, done, lease+5*time.Second, "waiter")
	gap := r.at.Sub(killed)
	t.Logf("SIGKILL to next acquire: %v (lease %v)", gap.Round(time.Millisecond), lease)
	if gap > lease+300*time.Millisecond {
		t.Fatalf("next acquire %v after SIGKILL, want <= lease + 300ms", gap)
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHolderSIGSTOPFencing pauses a holder process (watchdog lease 1 s)
// with SIGSTOP until another holder has taken the lock and written to the
// fenced register, queues writes on the paused holder's stdin, then
// resumes it. It fails unless the paused holder's Lost fires on resume,
// every one of its writes (carrying its old token) is rejected, and its
// Unlock reports the loss. It would fail if tokens did not increase across
// holds (the register would accept the stale writes), if the watchdog did
// not notice its deadline passed while paused, or if Unlock touched the new
// owner's hold.
func TestHolderSIGSTOPFencing(t *testing.T) {
	const lease = time.Second
	const staleWrites = 20
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	register := "fault:" + name + ":register"
	t.Cleanup(func() { rdb.Del(ctx, register) })

	a := startHolder(t, "serve", "-addr", addr, "-name", name, "-watchdog", lease.String(), "-register", register)
	ta := a.lockToken(5 * time.Second)
	a.send("write a-before-pause")
	a.expect("write ok", 5*time.Second)

	a.pause()
	paused := time.Now()
	b := must(newClient(t, addr).NewMutex(name))
	r := await(t, lockAsync(b, ctx), lease+5*time.Second, "second holder")
	tb := b.Token()
	t.Logf("paused holder (token %d) replaced by token %d after %v", ta, tb, r.at.Sub(paused).Round(time.Millisecond))
	if tb <= ta {
		t.Fatalf("new token %d is not above the paused holder's %d", tb, ta)
	}
	if ok, err := fence.Write(ctx, rdb, register, tb, "b", "b"); err != nil || !ok {
		t.Fatalf("new holder's write: ok=%v err=%v", ok, err)
	}
	for range staleWrites {
		a.send("write a-stale") // read by the holder only after it resumes
	}
	a.signal(syscall.SIGCONT)
	resumed := time.Now()

	rejected := 0
	for range staleWrites {
		l, _ := a.expect("write ", 5*time.Second)
		if l == "write rejected "+itoa(ta) {
			rejected++
		} else {
			t.Errorf("stale write: %q", l)
		}
	}
	_, lostAt := a.expect("lost", 5*time.Second)
	t.Logf("Lost %v after resume; %d/%d stale writes rejected", lostAt.Sub(resumed).Round(time.Millisecond), rejected, staleWrites)
	if rejected != staleWrites {
		t.Fatalf("%d of %d stale writes rejected, want all", rejected, staleWrites)
	}
	a.send("unlock")
	if l, _ := a.expect("error", 5*time.Second); !contains(l, "lock lost") {
		t.Fatalf("paused holder's unlock: %q, want lock lost", l)
	}
	select {
	case <-b.Lost():
		t.Fatal("the new holder's hold was lost")
	default:
	}
	if v, _ := rdb.HGet(ctx, register, "value").Result(); v != "b" {
		t.Fatalf("register holds %q, want the new holder's write", v)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFairQueuedWaiterSIGKILL queues four fair waiters behind a holder:
// W1, W2 (a helper process), W3, W4; SIGKILLs W2 while it is queued and
// releases the lock at once, before W2's heartbeat runs out, so that W1's
// release hands the lock to the dead W2. It fails unless the order of the
// survivors is W1, W3, W4 and W3 gets the lock within heartbeat + one
// heartbeat interval (hb/3) + 300 ms of W1's release: the hand-off lease of
// the dead W2 is the heartbeat, and nobody publishes when it runs out, so
// W3 learns the lock is free from its next heartbeat. It would fail if a
// hand-off to a dead waiter were not freed by its short hand-off lease, or
// if the live waiters behind it were never told the lock is free.
func TestFairQueuedWaiterSIGKILL(t *testing.T) {
	const hb = time.Second
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	queueLen := func() int64 { return rdb.LLen(ctx, queueKey(name)).Val() }
	opts := []redisync.Option{redisync.WithWaiterTimeout(hb)}

	h := must(newClient(t, addr, opts...).NewMutex(name))
	if err := h.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	type got struct {
		id int
		at time.Time
	}
	order := make(chan got, 3)
	release := map[int]chan struct{}{1: make(chan struct{}), 3: make(chan struct{}), 4: make(chan struct{})}
	lockErrs, unlockErrs := make(chan error, 3), make(chan error, 3)
	queue := func(id int) {
		m := must(newClient(t, addr, opts...).NewMutex(name))
		go func() {
			if err := m.Lock(lctx); err != nil {
				lockErrs <- err
				return
			}
			order <- got{id, time.Now()}
			<-release[id]
			unlockErrs <- m.Unlock(ctx)
		}()
	}
	queue(1)
	eventually(t, 5*time.Second, "W1 queued", func() bool { return queueLen() == 1 })
	w2 := startHolder(t, "serve", "-addr", addr, "-name", name, "-fair", "-heartbeat", hb.String())
	w2.send("lock")
	eventually(t, 5*time.Second, "W2 queued", func() bool { return queueLen() == 2 })
	queue(3)
	eventually(t, 5*time.Second, "W3 queued", func() bool { return queueLen() == 3 })
	queue(4)
	eventually(t, 5*time.Second, "W4 queued", func() bool { return queueLen() == 4 })

	w2.kill()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var seq []int
	var w1Released time.Time
	for range 3 {
		select {
		case g := <-order:
			seq = append(seq, g.id)
			switch g.id {
			case 1:
				w1Released = time.Now()
			case 3:
				if w1Released.IsZero() {
					break
				}
				gap := g.at.Sub(w1Released)
				t.Logf("W1 release to W3 acquire, past the dead W2: %v (heartbeat %v)", gap.Round(time.Millisecond), hb)
				if bound := hb + hb/3 + 300*time.Millisecond; gap > bound {
					t.Errorf("gap %v past the dead waiter, want <= %v", gap, bound)
				}
			}
			close(release[g.id])
		case err := <-lockErrs:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatalf("order so far %v: a waiter hangs", seq)
		}
	}
	for range 3 {
		if err := <-unlockErrs; err != nil {
			t.Fatal(err)
		}
	}
	if want := []int{1, 3, 4}; !equal(seq, want) {
		t.Fatalf("order %v, want %v", seq, want)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSemaphoreHolderSIGKILL kills a process that holds 2 of a semaphore's
// 3 permits (watchdog lease 1 s) while a waiter wants 2 and another holder
// keeps the third. It fails unless the waiter gets its permits within
// lease + 300 ms of the kill, and unless the permits held afterwards, as
// Redis counts them, are the waiter's 2 and the other holder's 1: never
// more than the size, and none left to the dead process.
func TestSemaphoreHolderSIGKILL(t *testing.T) {
	const lease = time.Second
	const size = 3
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	holder := startHolder(t, "serve", "-addr", addr, "-name", name, "-sem", "3", "-watchdog", lease.String())
	holder.send("acquire 2")
	holder.expect("acquired 2", 5*time.Second)

	c := newClient(t, addr, redisync.WithCrashTimeout(lease))
	other := must(c.NewSemaphore(name, size))
	if err := other.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waiter := must(c.NewSemaphore(name, size))
	done := make(chan time.Time, 1)
	errs := make(chan error, 1)
	go func() {
		if err := waiter.Acquire(ctx, 2); err != nil {
			errs <- err
			return
		}
		done <- time.Now()
	}()
	queue := "redisync:sem:{" + name + "}:queue"
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return rdb.ZCard(ctx, queue).Val() == 1 })
	time.Sleep(lease / 2) // the kill lands mid-lease, after a renewal (a deliberate pause)

	killed := time.Now()
	holder.kill()
	select {
	case at := <-done:
		gap := at.Sub(killed)
		t.Logf("SIGKILL to the waiter's permits: %v (lease %v)", gap.Round(time.Millisecond), lease)
		if gap > lease+300*time.Millisecond {
			t.Fatalf("the waiter got its permits %v after SIGKILL, want <= lease + 300ms", gap)
		}
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(lease + 5*time.Second):
		t.Fatal("the waiter never got the dead holder's permits")
	}
	var used int64
	holders := rdb.HGetAll(ctx, "redisync:sem:{"+name+"}").Val()
	if c, _, _ := schema.ParseSemUsed(holders[schema.SemUsedField]); c != size {
		t.Fatalf("the count of permits in use is %q, want %d", holders[schema.SemUsedField], size)
	}
	maps.DeleteFunc(holders, func(f, _ string) bool { return !schema.SemHolderField(f) })
	for _, v := range holders {
		n, _, _ := strings.Cut(v, ":")
		p, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("holder record %q: %v", v, err)
		}
		used += p
	}
	if used != size {
		t.Fatalf("%d permits held after the waiter got its 2, want %d (the waiter's 2 and the other's 1)", used, size)
	}
	if err := waiter.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}
