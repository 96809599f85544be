package redisync

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/watchdog"
)

// entry returns the watchdog entry of m's hold and a copy of its schedule,
// read under the watchdog's lock.
func entry(t *testing.T, m *Mutex) (e *watchdog.Entry, deadline, confirmed time.Time) {
	t.Helper()
	m.mu.Lock()
	h := m.cur
	m.mu.Unlock()
	if h == nil {
		t.Fatal("m holds nothing")
	}
	deadline, confirmed, _ = m.c.wd.Schedule(h.ka)
	return h.ka, deadline, confirmed
}

// freeze stops miniredis's clock (the server time that scripts read) at
// the current time, in whole ms, and returns it.
func freeze(mr *miniredis.Miniredis) time.Time {
	now := time.Now().Truncate(time.Millisecond)
	mr.SetTime(now)
	return now
}

// leaseIn returns the lease left at now (server time) to the hold of the
// lock whose hash is key: its {end} field, not the key's TTL.
func leaseIn(t *testing.T, mr *miniredis.Miniredis, key string, now time.Time) time.Duration {
	t.Helper()
	end, err := strconv.ParseInt(mr.HGet(key, schema.EndField), 10, 64)
	if err != nil {
		t.Fatalf("%s: no lease end: %v", key, err)
	}
	return time.Duration(end-now.UnixMilli()) * time.Millisecond
}

// renewed waits until the watchdog has renewed m's hold twice after since.
func renewed(t *testing.T, m *Mutex, since time.Time) {
	t.Helper()
	var seen time.Time
	n := 0
	eventually(t, 5*time.Second, "two renewals of the hold", func() bool {
		_, _, confirmed := entry(t, m)
		if confirmed.After(since) && confirmed.After(seen) {
			seen = confirmed
			n++
		}
		return n >= 2
	})
}

// A renewal never shortens a lease that is longer than the watchdog's (as
// one set by Extend): the local deadline counts from the send time of the
// calls that set the lease, so a renewal that ran after a longer lease was
// set, and cut it, would leave the key to expire before the deadline.
func TestWatchdogRenewalNeverShortensALease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	at := freeze(mr)
	c := newClient(t, rdb, WithCrashTimeout(60*time.Millisecond))
	m := must(c.NewMutex("long"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	key := "redisync:lock:{long}"
	mr.HSet(key, schema.EndField, strconv.FormatInt(at.Add(time.Minute).UnixMilli(), 10))
	now := time.Now()
	renewed(t, m, now)
	if ttl := leaseIn(t, mr, key, at); ttl != time.Minute {
		t.Fatalf("the lease is %v after renewals, want the longer 1m kept", ttl)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Extend under a fixed lease sets the lease in Redis and moves the local
// deadline, counted from the call's sending; it never shortens a lease.
func TestMutexExtendFixedLease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	at := freeze(mr)
	c := newClient(t, rdb)
	m := must(c.NewMutex("ext", WithFixedLease(time.Second)))
	key := "redisync:lock:{ext}"
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// The reply comes 200 ms after Redis ran the call: the deadline
	// counts from the sending all the same.
	addHook(rdb, slowReply{sha: extendScript.Hash(), d: 200 * time.Millisecond})
	before := time.Now()
	if err := m.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if took := time.Since(before); took < 200*time.Millisecond {
		t.Fatalf("Extend took %v, the reply was not held up", took)
	}
	if ttl := leaseIn(t, mr, key, at); ttl != 5*time.Second {
		t.Fatalf("the lease in Redis is %v after Extend(5s)", ttl)
	}
	_, deadline, _ := entry(t, m)
	want := before.Add(5*time.Second - watchdog.Drift(5*time.Second))
	if deadline.Before(want) || deadline.After(want.Add(100*time.Millisecond)) {
		t.Fatalf("the local deadline is %v after the call was sent, want sent + 5s - drift (%v)",
			deadline.Sub(before), 5*time.Second-watchdog.Drift(5*time.Second))
	}

	// A shorter lease changes nothing, in Redis or locally.
	if err := m.Extend(ctx, time.Second); err != nil {
		t.Fatalf("Extend with a shorter lease: %v", err)
	}
	if ttl := leaseIn(t, mr, key, at); ttl != 5*time.Second {
		t.Fatalf("Extend(1s) cut the lease to %v", ttl)
	}
	if _, d, _ := entry(t, m); !d.Equal(deadline) {
		t.Fatalf("Extend(1s) moved the local deadline by %v", d.Sub(deadline))
	}

	// Re-entering does not re-arm the extended lease, nor cut it.
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	if err := m.Lock(hctx); err != nil {
		t.Fatal(err)
	}
	if ttl := leaseIn(t, mr, key, at); ttl != 5*time.Second {
		t.Fatalf("re-entering changed the lease to %v", ttl)
	}
	for range 2 {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if lockHeldAt(t, mr, m.keys, at) {
		t.Fatal("the extended hold was not released")
	}
}

// Under the watchdog, Extend gives a one-off longer lease: the renewals go
// on and neither cut it in Redis nor move the local deadline back.
func TestMutexExtendUnderWatchdog(t *testing.T) {
	mr, rdb, _ := newMini(t)
	// A short lease, for renewals to come soon; not so short that a
	// loaded machine's late renewal loses the hold before Extend (60 ms
	// did, once, in CI beside another test run).
	at := freeze(mr)
	c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond))
	m := must(c.NewMutex("extwd"))
	key := "redisync:lock:{extwd}"
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := m.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	_, deadline, _ := entry(t, m)
	if min := sent.Add(time.Minute - watchdog.Drift(time.Minute)); deadline.Before(min) {
		t.Fatalf("the local deadline is %v short of sent + 1m - drift", min.Sub(deadline))
	}
	renewed(t, m, time.Now())
	if ttl := leaseIn(t, mr, key, at); ttl != time.Minute {
		t.Fatalf("the lease in Redis is %v after renewals, want the extended 1m", ttl)
	}
	if _, d, _ := entry(t, m); d.Before(deadline) {
		t.Fatalf("a renewal moved the local deadline %v earlier", deadline.Sub(d))
	}
	select {
	case <-m.Lost():
		t.Fatal("Lost closed")
	default:
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMutexExtendErrors(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	at := freeze(mr)
	c := newClient(t, rdb, WithCrashTimeout(time.Minute))
	m := must(c.NewMutex("exterr"))
	key := "redisync:lock:{exterr}"

	// Nothing reaches Redis for a bad lease or when nothing is held.
	for _, lease := range []time.Duration{0, -time.Second, 500 * time.Microsecond, MaxLease + time.Millisecond} {
		if err := m.Extend(ctx, lease); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("Extend(%v): %v, want ErrInvalidOption", lease, err)
		}
	}
	if err := m.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend with nothing held: %v, want ErrNotHeld", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Fatalf("%d commands reached Redis, want 0", n)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, 0); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Extend(0) while held: %v, want ErrInvalidOption", err)
	}
	if ttl := leaseIn(t, mr, key, at); ttl != time.Minute {
		t.Fatalf("a refused Extend changed the lease to %v", ttl)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Extend(cancelled, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Extend with a cancelled ctx: %v, want context.Canceled", err)
	}

	// The hold removed, and the lock taken by another owner: Extend
	// reports the loss, closes Lost, and leaves the new owner's lease be.
	lost := m.Lost()
	mr.Del(key)
	other := must(c.NewMutex("exterr", WithFixedLease(time.Second)))
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		t.Fatalf("another owner's TryLock: %v, %v", ok, err)
	}
	if err := m.Extend(ctx, time.Hour); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Extend of a hold gone from Redis: %v, want ErrLockLost", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("Extend found the hold gone and Lost is still open")
	}
	if ttl := leaseIn(t, mr, key, at); ttl != time.Second {
		t.Fatalf("Extend of a lost hold changed the new owner's lease to %v", ttl)
	}
	if err := m.Extend(ctx, time.Hour); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Extend of a lost hold: %v, want ErrLockLost", err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock: %v, want ErrLockLost", err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// slowReply is a go-redis hook that holds up the reply of every EVALSHA of
// one script by d, after Redis ran it: a slow network on the way back.
type slowReply struct {
	passHooks
	sha string
	d   time.Duration
}

func (h slowReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 && args[1] == h.sha {
			time.Sleep(h.d) // latency on the way back, not a wait for an event
		}
		return err
	}
}

func TestMutexTTL(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	at := freeze(mr)
	c := newClient(t, rdb)
	m := must(c.NewMutex("ttl", WithFixedLease(2*time.Second)))
	key := "redisync:lock:{ttl}"
	if d, err := m.TTL(ctx); d != 0 || !errors.Is(err, ErrNotHeld) {
		t.Fatalf("TTL with nothing held: %v, %v, want 0, ErrNotHeld", d, err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Fatalf("TTL with nothing held sent %d commands, want 0", n)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := m.TTL(ctx); d != 2*time.Second || err != nil {
		t.Fatalf("TTL: %v, %v, want 2s", d, err)
	}
	mr.SetTime(at.Add(500 * time.Millisecond))
	if d, err := m.TTL(ctx); d != 1500*time.Millisecond || err != nil {
		t.Fatalf("TTL 500ms later: %v, %v, want 1.5s", d, err)
	}
	if err := m.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d, err := m.TTL(ctx); d != 5*time.Second || err != nil {
		t.Fatalf("TTL after Extend(5s): %v, %v, want 5s", d, err)
	}

	// Another owner's hold is not m's: TTL reports the loss and closes
	// Lost; later calls say so without asking Redis.
	lost := m.Lost()
	mr.Del(key)
	other := must(c.NewMutex("ttl", WithFixedLease(time.Second)))
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		t.Fatalf("another owner's TryLock: %v, %v", ok, err)
	}
	if d, err := m.TTL(ctx); d != 0 || !errors.Is(err, ErrLockLost) {
		t.Fatalf("TTL of a hold gone from Redis: %v, %v, want 0, ErrLockLost", d, err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("TTL found the hold gone and Lost is still open")
	}
	sent := cnt.n.Load()
	if d, err := m.TTL(ctx); d != 0 || !errors.Is(err, ErrLockLost) || cnt.n.Load() != sent {
		t.Fatalf("TTL of a lost hold: %v, %v, %d commands; want 0, ErrLockLost, none", d, err, cnt.n.Load()-sent)
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock: %v, want ErrLockLost", err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A holder that hangs while alive (it never unlocks; its process goes on
// renewing) is renewed no longer than WithMaxHold: it loses the hold by the
// cap plus one lease, Lost tells it, and Redis lets the lock go within a
// lease of the last renewal.
func TestMutexMaxHoldStopsRenewingAHungHolder(t *testing.T) {
	mr, rdb, _ := newMini(t)
	const lease, limit = 150 * time.Millisecond, 450 * time.Millisecond
	c := newClient(t, rdb, WithCrashTimeout(lease), WithMaxHold(limit))
	m := must(c.NewMutex("hung"))
	start := time.Now()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// The holder hangs: it waits for nothing but Lost.
	select {
	case <-m.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a hold past its max hold time is still renewed after 5s")
	}
	took := time.Since(start)
	if took < limit || took > limit+lease+time.Second {
		t.Fatalf("Lost closed %v after Lock, want within [%v, %v + %v]", took, limit, limit, lease)
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of the capped hold: %v, want ErrLockLost", err)
	}

	// The cap is per hold: the next one is renewed again, until its own.
	other := must(c.NewMutex("hung", WithMaxHold(0)))
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if e, _, _ := entry(t, other); !e.Until.IsZero() {
		t.Fatal("WithMaxHold(0) on the Mutex left the Client's cap on")
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Redis lets the lock go a lease after the last renewal: here, with
	// no one renewing, when miniredis's clock moves on by the lease.
	hung := must(c.NewMutex("hung2"))
	if err := hung.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hung.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the second capped hold is still renewed after 5s")
	}

	// A renewal after Lost closed would have moved the lease's end past
	// a lease from then.
	lostAt := time.Now()
	if lockHeldAt(t, mr, hung.keys, lostAt.Add(lease)) {
		t.Fatal("the capped hold was renewed after Lost closed")
	}
	if lockHeldAt(t, mr, m.keys, time.Now()) {
		t.Fatal("the first hold is left")
	}
	if err := hung.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock: %v, want ErrLockLost", err)
	}
}

// Extend is the holder's own call: the cap does not undo it.
func TestMutexMaxHoldDoesNotCapExtend(t *testing.T) {
	mr, rdb, _ := newMini(t)
	at := freeze(mr)
	c := newClient(t, rdb, WithCrashTimeout(600*time.Millisecond), WithMaxHold(300*time.Millisecond))
	m := must(c.NewMutex("capext"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := m.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the watchdog to stop renewing", func() bool {
		e, _, _ := entry(t, m)
		_, _, renewed := m.c.wd.Schedule(e)
		return !renewed
	})
	if _, d, _ := entry(t, m); d.Before(sent.Add(time.Minute - watchdog.Drift(time.Minute))) {
		t.Fatalf("the capped hold's deadline is %v short of the extended lease", sent.Add(time.Minute).Sub(d))
	}
	if ttl := leaseIn(t, mr, "redisync:lock:{capext}", at); ttl != time.Minute {
		t.Fatalf("the lease in Redis is %v, want the extended 1m", ttl)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A RedMutex's node holds are Mutex holds: the cap ends the RedMutex's.
func TestRedlockMaxHold(t *testing.T) {
	_, rdbs, _ := newMiniNodes(t, 3)
	const lease, limit = 400 * time.Millisecond, 1200 * time.Millisecond
	// The default node timeout, a tenth of the lease, is shorter than a
	// first script load on the embedded Redis under -race; a round must
	// take less than the lease on a busy machine.
	r := newRedlock(t, rdbs, WithCrashTimeout(lease), WithMaxHold(limit), WithNodeTimeout(200*time.Millisecond))
	m := must(r.NewMutex("hung"))
	start := time.Now()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a RedMutex past its max hold time is still renewed after 5s")
	}
	if took := time.Since(start); took < limit || took > limit+lease+time.Second {
		t.Fatalf("Lost closed %v after Lock, want within [%v, %v + %v]", took, limit, limit, lease)
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock: %v, want ErrLockLost", err)
	}
}

// A late copy of the acquire that took a hold (a stalled connection that
// delivers it after go-redis's retry was answered) must not cut a lease
// that Extend has made longer since: the local deadline counts on it.
func TestMutexLateAcquireCopyKeepsExtendedLease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	at := freeze(mr)
	c := newClient(t, rdb)
	m := must(c.NewMutex("late", WithFixedLease(time.Second)))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	k := m.keys
	// Its keys and arguments: scripts/acquire.lua.
	res, err := acquireScript.Run(ctx, rdb, []string{k.Hash, k.Queue, k.Bargers, k.Tombstone(m.holdID())},
		m.holdID(), time.Second.Milliseconds(), "barge", 0, m.cfg.grantLease().Milliseconds(), "").Int64Slice()
	if err != nil || res[0] != 1 {
		t.Fatalf("the late copy: %v, %v; want it to find its ticket holding", res, err)
	}
	if ttl := leaseIn(t, mr, k.Hash, at); ttl != time.Minute {
		t.Fatalf("a late copy of the acquire cut the extended lease to %v", ttl)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Semaphore's holding is renewed no longer than WithMaxHold, counted
// from when the value went from no permits to some, whatever Acquires
// follow: Lost closes by the cap plus a lease, and the permits come free.
func TestSemaphoreMaxHold(t *testing.T) {
	_, rdb, _ := newMini(t)
	const lease, limit = 150 * time.Millisecond, 450 * time.Millisecond
	c := newClient(t, rdb, WithCrashTimeout(lease), WithMaxHold(limit))
	s := must(c.NewSemaphore("hung", 2))
	start := time.Now()
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Acquire(ctx, 1); err != nil { // adds to the holding
		t.Fatal(err)
	}
	select {
	case <-s.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a holding past its max hold time is still renewed after 5s")
	}
	if took := time.Since(start); took < limit || took > limit+lease+time.Second {
		t.Fatalf("Lost closed %v after the first Acquire, want within [%v, %v + %v]", took, limit, limit, lease)
	}
	other := must(c.NewSemaphore("hung", 2, WithMaxHold(0)))
	eventually(t, 5*time.Second, "the capped permits to come free", func() bool {
		ok, err := other.TryAcquire(ctx, 2)
		return err == nil && ok
	})
}
