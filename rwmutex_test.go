package redisync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redisync/redisync/internal/schema"
)

const rwKey = "redisync:rw:{rw}"

// rwQueueLen returns the number of waiters queued for the RWMutex "rw".
func rwQueueLen(t *testing.T, mr *miniredis.Miniredis) int {
	t.Helper()
	if !mr.Exists(rwKey + ":queue") {
		return 0
	}
	m, err := mr.ZMembers(rwKey + ":queue")
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// async runs f in a goroutine and returns its error on a channel.
func async(f func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	return done
}

// pending fails the test if done has delivered.
func pending(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned: %v", what, err)
	default:
	}
}

func TestRWMutexInvalidInputFailsBeforeRedis(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	checkInvalid(t, errOf(c.NewRWMutex("")), ErrInvalidName)
	checkInvalid(t, errOf(c.NewRWMutex("}rw")), ErrInvalidName)
	checkInvalid(t, errOf(c.NewRWMutex("rw", WithFixedLease(0))), ErrInvalidOption)
	cases := []struct {
		name string
		rw   *RWMutex
		ctx  context.Context
		want error
	}{
		{"cancelled context", must(c.NewRWMutex("rw")), cancelled, context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.rw.RLock(tc.ctx); !errors.Is(err, tc.want) {
				t.Errorf("RLock: got %v, want %v", err, tc.want)
			}
			if err := tc.rw.Lock(tc.ctx); !errors.Is(err, tc.want) {
				t.Errorf("Lock: got %v, want %v", err, tc.want)
			}
			if ok, err := tc.rw.TryRLock(tc.ctx); ok || !errors.Is(err, tc.want) {
				t.Errorf("TryRLock: got %v, %v, want false, %v", ok, err, tc.want)
			}
			if ok, err := tc.rw.TryLock(tc.ctx); ok || !errors.Is(err, tc.want) {
				t.Errorf("TryLock: got %v, %v, want false, %v", ok, err, tc.want)
			}
			want := tc.want
			if want == context.Canceled {
				want = ErrNotHeld // nothing held: nothing to release
			}
			if err := tc.rw.RUnlock(tc.ctx); !errors.Is(err, want) {
				t.Errorf("RUnlock: got %v, want %v", err, want)
			}
			if err := tc.rw.Unlock(tc.ctx); !errors.Is(err, want) {
				t.Errorf("Unlock: got %v, want %v", err, want)
			}
		})
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands reached Redis, want 0", n)
	}
}

func TestRWMutexReadersShareWritersExclude(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	r1, r2, w := must(c.NewRWMutex("rw")), must(c.NewRWMutex("rw")), must(c.NewRWMutex("rw"))
	if err := r1.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := r2.TryRLock(ctx); !ok || err != nil {
		t.Fatalf("TryRLock beside a reader: %v, %v", ok, err)
	}
	if r1.Token() != 0 || r2.Token() != 0 {
		t.Fatalf("a read has a token: %d, %d", r1.Token(), r2.Token())
	}
	if ok, err := w.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock beside readers: %v, %v, want false", ok, err)
	}
	locked := async(func() error { return w.Lock(ctx) })
	eventually(t, 5*time.Second, "the writer to queue", func() bool { return rwQueueLen(t, mr) == 1 })
	// A reader that comes after a waiting writer queues behind it.
	if ok, err := must(c.NewRWMutex("rw")).TryRLock(ctx); ok || err != nil {
		t.Fatalf("TryRLock ahead of a queued writer: %v, %v, want false", ok, err)
	}
	st, err := c.InspectRWMutex(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	if st.Writer != nil || len(st.Readers) != 2 || st.ReadersLen != 2 || len(st.Queue) != 1 || !st.Queue[0].Write {
		t.Fatalf("InspectRWMutex: writer %+v, readers %+v, queue %+v; want 2 reads and a write queued", st.Writer, st.Readers, st.Queue)
	}
	if err := r1.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	pending(t, locked, "Lock with a reader left")
	if err := r2.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, locked); err != nil {
		t.Fatal(err)
	}
	first := w.Token()
	if first <= 0 {
		t.Fatalf("write token %d", first)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Token() <= first {
		t.Fatalf("second write's token %d, not above the first's %d", w.Token(), first)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := holderFields(t, mr, rwKey); len(got) != 0 {
		t.Fatalf("holders left: %v", got)
	}
}

// TestRWMutexReentryAndUpgrade: the write re-enters through its context,
// as a write and as a read, without Redis; a reader and a writer of other
// values queue behind it in that order; inside a read's context a write
// is refused with ErrUpgrade; a write asked for outside it waits.
func TestRWMutexReentryAndUpgrade(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	rw, other, writer := must(c.NewRWMutex("rw")), must(c.NewRWMutex("rw")), must(c.NewRWMutex("rw"))
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := rw.Token()
	hctx, cancel := rw.HoldContext(ctx)
	defer cancel()
	sent := cnt.n.Load()
	if err := rw.Lock(hctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.RLock(hctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := rw.TryRLock(hctx); !ok || err != nil {
		t.Fatalf("TryRLock under the write: %v, %v", ok, err)
	}
	if n := cnt.n.Load() - sent; n != 0 {
		t.Fatalf("re-entering sent %d commands, want none", n)
	}
	if ok, err := rw.TryRLock(ctx); ok || err != nil {
		t.Fatalf("TryRLock outside the write's context: %v, %v; want false", ok, err)
	}
	// other reads and writer writes: both queue, in that order.
	read := async(func() error { return other.RLock(ctx) })
	eventually(t, 5*time.Second, "the reader to queue", func() bool { return rwQueueLen(t, mr) == 1 })
	write := async(func() error { return writer.Lock(ctx) })
	eventually(t, 5*time.Second, "the writer to queue", func() bool { return rwQueueLen(t, mr) == 2 })
	for range 3 { // the inner levels
		if err := rw.Unlock(hctx); err != nil {
			t.Fatal(err)
		}
		if rw.Token() != token || hctx.Err() != nil {
			t.Fatalf("token %d (want %d), context %v after an inner Unlock", rw.Token(), token, hctx.Err())
		}
	}
	pending(t, read, "RLock under a write")
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(hctx), ErrReleased) {
		t.Fatalf("the write's context after its last Unlock: %v, want ErrReleased", context.Cause(hctx))
	}
	if err := result(t, read); err != nil {
		t.Fatalf("the reader queued behind the write: %v", err)
	}
	pending(t, write, "Lock beside a reader")
	if err := other.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Unlock with no write: %v, want ErrNotHeld", err)
	}
	if err := other.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, write); err != nil {
		t.Fatal(err)
	}
	if writer.Token() <= token {
		t.Fatalf("handed-over write's token %d, not above %d", writer.Token(), token)
	}
	if err := writer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	err := other.RDo(ctx, func(rctx context.Context) error {
		if err := other.Lock(rctx); !errors.Is(err, ErrUpgrade) {
			return fmt.Errorf("Lock inside a read's context: %v, want ErrUpgrade", err)
		}
		if ok, err := other.TryLock(rctx); ok || !errors.Is(err, ErrUpgrade) {
			return fmt.Errorf("TryLock inside a read's context: %v, %v, want ErrUpgrade", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.RUnlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("RUnlock of nothing: %v, want ErrNotHeld", err)
	}
}

// TestRWMutexFIFOAcrossClients queues a mix of readers and writers, each
// on a Client of its own (a process of its own), behind a writer, and
// checks that they get the lock in their exact order of arrival: each run
// of consecutive readers together, each writer alone.
func TestRWMutexFIFOAcrossClients(t *testing.T) {
	mr, rdb, _ := newMini(t)
	first := must(newClient(t, rdb).NewRWMutex("rw"))
	if err := first.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	order := "RRWRWWRR"
	type waiter struct {
		rw    *RWMutex
		write bool
		done  <-chan error
	}
	ws := make([]waiter, len(order))
	for i, kind := range order {
		w := waiter{rw: must(newClient(t, rdb, WithRecheck(time.Hour)).NewRWMutex("rw")), write: kind == 'W'}
		if w.write {
			w.done = async(func() error { return w.rw.Lock(ctx) })
		} else {
			w.done = async(func() error { return w.rw.RLock(ctx) })
		}
		ws[i] = w
		eventually(t, 5*time.Second, "the waiter to queue", func() bool { return rwQueueLen(t, mr) == i+1 })
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(ws); {
		// The next group: one writer, or the run of readers.
		j := i + 1
		for !ws[i].write && j < len(ws) && !ws[j].write {
			j++
		}
		for k := i; k < j; k++ {
			if err := result(t, ws[k].done); err != nil {
				t.Fatalf("waiter %d: %v", k, err)
			}
		}
		if j < len(ws) {
			pending(t, ws[j].done, "a waiter behind the holders")
		}
		for k := i; k < j; k++ {
			release := ws[k].rw.RUnlock
			if ws[k].write {
				release = ws[k].rw.Unlock
			}
			if err := release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		i = j
	}
}

// TestRWMutexCrashedReaderBlocksForItsLease: a reader that never releases
// (its process gone; here its fixed lease is left to run out unrenewed)
// keeps a writer out for no longer than its lease; the reader's context
// ends with the loss.
func TestRWMutexCrashedReaderBlocksForItsLease(t *testing.T) {
	rdb := newReal(t)
	name := uniqueName(t)
	const lease = 300 * time.Millisecond
	reader := must(newClient(t, rdb).NewRWMutex(name, WithFixedLease(lease)))
	reading := make(chan struct{})
	readDone := async(func() error {
		return reader.RDo(ctx, func(rctx context.Context) error {
			close(reading)
			select {
			case <-rctx.Done():
				return context.Cause(rctx)
			case <-time.After(5 * time.Second):
				return errors.New("the crashed reader's context did not end")
			}
		})
	})
	<-reading
	start := time.Now()
	other := must(newClient(t, rdb).NewRWMutex(name, WithFixedLease(time.Hour)))
	if err := other.RLock(ctx); err != nil { // a live reader, released at once
		t.Fatal(err)
	}
	if err := other.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	writer := must(newClient(t, rdb, WithRecheck(time.Hour)).NewRWMutex(name))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := writer.Lock(wctx); err != nil {
		t.Fatalf("the writer waited past the crashed reader's lease: %v", err)
	}
	if took := time.Since(start); took < lease-50*time.Millisecond || took > lease+time.Second {
		t.Fatalf("the writer got in after %v, want about the reader's lease %v", took, lease)
	}
	if err := result(t, readDone); !errors.Is(err, ErrLockLost) {
		t.Fatalf("RDo of the lost read: %v, want ErrLockLost", err)
	}
	if err := writer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRWMutexWrongTypeTokenIsAnErrorAndWritesNothing(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	mr.HSet(rwKey, "{token}", "x")
	if err := must(c.NewRWMutex("rw")).Lock(ctx); !errors.Is(err, ErrWrongType) {
		t.Fatalf("Lock with a last token that is not a number: %v, want ErrWrongType", err)
	}
	// Nothing held or queued: only the failed call's withdrawal is
	// recorded (a copy of it may still be on its way).
	if got := holderFields(t, mr, rwKey); len(got) != 0 || mr.Exists(rwKey+":queue") || mr.Exists(rwKey+":expiry") {
		t.Fatalf("after the failed call: holders %v, queue %v", got, mr.Exists(rwKey+":queue"))
	}
	// A read fails too: the state is not redisync's.
	if err := must(c.NewRWMutex("rw")).RLock(ctx); !errors.Is(err, ErrWrongType) {
		t.Fatalf("RLock beside a last token that is not a number: %v, want ErrWrongType", err)
	}
	if v := mr.HGet(rwKey, "{token}"); v != "x" {
		t.Fatalf("the bad token was changed: %q", v)
	}
}

// TestRWMutexRetriedWriteKeepsItsToken: go-redis runs a write's acquire
// twice (a retry after a lost reply); the retry is applied once and
// answers the token the first run minted.
func TestRWMutexRetriedWriteKeepsItsToken(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	w := must(c.NewRWMutex("rw"))
	if err := w.Lock(ctx); err != nil { // loads the script
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	cnt.armReplay(semAcquireScript)
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	stored, err := strconv.ParseInt(mr.HGet(rwKey, "{token}"), 10, 64)
	if err != nil || w.Token() != stored {
		t.Fatalf("token %d after a replayed acquire, counter %d (%v)", w.Token(), stored, err)
	}
	if got := holderFields(t, mr, rwKey); len(got) != 1 || mr.HGet(rwKey, schema.SemUsedField) == "" {
		t.Fatalf("holders %v, want one, and the count", got)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := holderFields(t, mr, rwKey); len(got) != 0 {
		t.Fatalf("holders left after Unlock: %v", got)
	}
}

// TestRWMutexHoldContext: the write's context outlives reads taken and
// given back under it, and ends with the write, ErrReleased.
func TestRWMutexHoldContext(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	rw := must(c.NewRWMutex("rw"))
	hctx, cancel := rw.HoldContext(ctx)
	if !errors.Is(context.Cause(hctx), ErrNotHeld) {
		t.Fatalf("hold context of nothing: cause %v, want ErrNotHeld", context.Cause(hctx))
	}
	cancel()
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel = rw.HoldContext(ctx)
	defer cancel()
	if err := rw.RLock(hctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.RUnlock(hctx); err != nil {
		t.Fatal(err)
	}
	if hctx.Err() != nil {
		t.Fatalf("a read under the write ended its context: %v", context.Cause(hctx))
	}
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(hctx), ErrReleased) {
		t.Fatalf("after the last release: cause %v, want ErrReleased", context.Cause(hctx))
	}
}

func TestRWMutexCloseReleasesAndEndsWaiters(t *testing.T) {
	mr, rdb, _ := newMini(t)
	holder, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, rdb, WithRecheck(time.Hour))
	r := must(holder.NewRWMutex("rw"))
	reading := make(chan struct{})
	readDone := async(func() error {
		return r.RDo(ctx, func(rctx context.Context) error {
			close(reading)
			<-rctx.Done()
			return context.Cause(rctx)
		})
	})
	<-reading
	w := must(c.NewRWMutex("rw"))
	locked := async(func() error { return w.Lock(ctx) })
	eventually(t, 5*time.Second, "the writer to queue", func() bool { return rwQueueLen(t, mr) == 1 })
	waiter := must(holder.NewRWMutex("rw"))
	read := async(func() error { return waiter.RLock(ctx) })
	eventually(t, 5*time.Second, "the reader to queue", func() bool { return rwQueueLen(t, mr) == 2 })
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	if err := result(t, readDone); !errors.Is(err, ErrLockLost) {
		t.Fatalf("the read's RDo at Close: %v, want its context ended as lost", err)
	}
	if err := result(t, read); !errors.Is(err, ErrClosed) {
		t.Fatalf("RLock queued at Close: %v, want ErrClosed", err)
	}
	if err := result(t, locked); err != nil { // the read was released
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRWMutexLostHoldIsReportedUntilReleased(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithCrashTimeout(300*time.Millisecond))
	rw := must(c.NewRWMutex("rw"))
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := rw.HoldContext(ctx)
	defer cancel()
	if err := rw.RLock(hctx); err != nil { // a read level under the write
		t.Fatal(err)
	}
	lost := rw.Lost()
	mr.Del(rwKey) // the holders, removed behind rw's back
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not close")
	}
	if err := rw.RLock(hctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("RLock under a lost write: %v, want ErrLockLost", err)
	}
	if err := rw.Lock(hctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Lock under a lost write: %v, want ErrLockLost", err)
	}
	if ok, err := rw.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while the lost write's Unlocks are owed: %v, %v; want false", ok, err)
	}
	if err := rw.RUnlock(hctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("RUnlock of the read level of a lost write: %v, want ErrLockLost", err)
	}
	if err := rw.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of a lost write: %v, want ErrLockLost", err)
	}
	if err := rw.Lock(ctx); err != nil {
		t.Fatalf("Lock once the lost hold was released: %v", err)
	}
	if rw.Lost() == lost || rw.Token() == 0 {
		t.Fatal("the new write is the lost hold")
	}
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
