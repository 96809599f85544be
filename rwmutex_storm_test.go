package redisync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// newReal returns a go-redis client to the package's real Redis (skipping
// the test when there is none, unless REDISYNC_REQUIRE_REDIS=1).
func newReal(t *testing.T) *redis.Client { return redistest.Client(t) }

// rwSpan is one hold of a RWMutex value seen from outside: from just after
// the call that took it returned to just before the call that ended it
// was made (or to when its Lost was seen closed), so that it lies inside
// the hold Redis granted.
type rwSpan struct {
	owner      int // the goroutine
	write      bool
	token      int64
	start, end time.Time
}

// rwHistory collects spans and checks them.
type rwHistory struct {
	mu    sync.Mutex
	spans []rwSpan
}

func (h *rwHistory) add(s rwSpan) {
	h.mu.Lock()
	h.spans = append(h.spans, s)
	h.mu.Unlock()
}

// check fails the test when a write overlaps any other hold, or when
// write tokens do not increase in the order the writes started. It
// returns how many pairs of reads overlapped.
func (h *rwHistory) check(t *testing.T) (sharedReads int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := slices.Clone(h.spans)
	slices.SortFunc(s, func(a, b rwSpan) int { return a.start.Compare(b.start) })
	var lastToken int64
	for i, a := range s {
		if a.write {
			if a.token <= lastToken {
				t.Errorf("write of goroutine %d started after a write with token %d but has token %d", a.owner, lastToken, a.token)
			}
			lastToken = a.token
		}
		for _, b := range s[i+1:] {
			if !b.start.Before(a.end) {
				break
			}
			if a.write || b.write {
				t.Errorf("overlap: owner %d (write %v, %v..%v) and owner %d (write %v, %v..%v)",
					a.owner, a.write, a.start, a.end, b.owner, b.write, b.start, b.end)
				return sharedReads
			}
			sharedReads++
		}
	}
	return sharedReads
}

// stormDeadline draws a call's deadline: mostly 0-5 ms, sometimes longer.
func stormDeadline(rng *rand.Rand) time.Duration {
	if rng.IntN(10) == 0 {
		return 100 * time.Millisecond
	}
	return time.Duration(rng.IntN(5000)) * time.Microsecond
}

// TestRWMutexCancellationStorm: 3 Clients and 12 goroutines call RLock,
// Lock, TryRLock and TryLock on one name again and again with deadlines of
// 0-5 ms (some 100 ms), hold a little, and re-enter through the hold's
// context (a read under a write; a write asked for under a read is
// refused with ErrUpgrade): in "own", each goroutine with a RWMutex value
// of its own; in "shared", 4 of them share a value by two, which excludes
// them as it excludes any other holder. No write may overlap another
// goroutine's hold, write tokens must increase, and afterwards the lock
// must be free and its queue empty.
func TestRWMutexCancellationStorm(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("REDISYNC_STORM_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Run("own", func(t *testing.T) { rwStorm(t, seed, 12) })
	t.Run("shared", func(t *testing.T) { rwStorm(t, seed, 10) })
}

// rwStorm runs the storm with 12 goroutines on values RWMutex values:
// goroutine g uses value g%values.
func rwStorm(t *testing.T, seed uint64, values int) {
	rdb := newReal(t)
	name := uniqueName(t)
	t.Logf("seed %d (REDISYNC_STORM_SEED replays it)", seed)
	clients := []*Client{newClient(t, rdb), newClient(t, rdb), newClient(t, rdb)}
	var h rwHistory
	var n stormCounts
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	vs := make([]*RWMutex, values)
	for v := range vs {
		vs[v] = must(clients[v%len(clients)].NewRWMutex(name, WithWaiterTimeout(300*time.Millisecond)))
	}
	for g := range 12 {
		rng := rand.New(rand.NewPCG(seed, uint64(g)))
		wg.Go(func() {
			for time.Now().Before(stop) {
				if err := stormRound(vs[g%values], g, rng, &h, &n); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	reads := h.check(t)
	t.Logf("%d holds, %d writes, %d reads under a write, %d upgrades refused, %d calls cancelled, %d overlapping reads",
		len(h.spans), n.writes.Load(), n.nested.Load(), n.upgrades.Load(), n.cancelled.Load(), reads)
	if n.writes.Load() == 0 || n.nested.Load() == 0 || n.upgrades.Load() == 0 || n.cancelled.Load() == 0 || reads == 0 {
		t.Error("the storm exercised too little")
	}
	keys := schema.RWMutexKeys(schema.DefaultPrefix, name)
	left := func() bool { // no holder record, nobody queued
		h, err := rdb.HGetAll(ctx, keys.Hash).Result()
		for _, f := range schema.SemFields {
			delete(h, f)
		}
		n, qerr := rdb.Exists(ctx, keys.Queue).Result()
		return err == nil && qerr == nil && len(h) == 0 && n == 0
	}
	for deadline := time.Now().Add(5 * time.Second); !left(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lock is not free 5 s after the storm: records %v, queue %v", rdb.HGetAll(ctx, keys.Hash).Val(),
				rdb.ZRangeWithScores(ctx, keys.Queue, 0, -1).Val())
		}
	}
}

// stormCounts counts what the storm did.
type stormCounts struct{ cancelled, writes, nested, upgrades atomic.Int64 }

// stormRound makes one call of the storm for goroutine g and, when it
// took a hold, holds it a little, re-entering it or asking for an upgrade
// under it at random, and releases it.
func stormRound(rw *RWMutex, g int, rng *rand.Rand, h *rwHistory, n *stormCounts) error {
	write := rng.IntN(4) == 0
	try := rng.IntN(4) == 0
	cctx, cancel := context.WithTimeout(ctx, stormDeadline(rng))
	defer cancel()
	var took bool // a try took the hold
	var err error
	switch {
	case write && try:
		took, err = rw.TryLock(cctx)
	case try:
		took, err = rw.TryRLock(cctx)
	}
	work := func() { time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond) }
	held := false // the hold came from a try: its context (a write's) is not round's
	round := func(hctx context.Context) error {
		span := rwSpan{owner: g, write: write, token: rw.Token(), start: time.Now()}
		if !write {
			span.token = 0
		}
		work()
		switch {
		case held:
		case write && rng.IntN(2) == 0: // a read under the write
			if err := rw.RLock(hctx); err != nil {
				return err
			}
			work()
			if err := rw.RUnlock(hctx); err != nil {
				return err
			}
			n.nested.Add(1)
		case !write && rng.IntN(4) == 0: // an upgrade: refused at once
			if err := rw.Lock(hctx); !errors.Is(err, ErrUpgrade) {
				return fmt.Errorf("a write asked for under a read: %v, want ErrUpgrade", err)
			}
			n.upgrades.Add(1)
		}
		span.end = time.Now()
		if hctx.Err() != nil {
			span.end = span.start // lost: the hold is not counted on
		}
		h.add(span)
		return nil
	}
	switch {
	case took: // taken by a try: release as Unlock or RUnlock does
		held = true
		err = round(context.Background())
		release := rw.RUnlock
		if write {
			release = rw.Unlock
		}
		err = errors.Join(err, release(ctx))
	case try:
	default:
		// The deadline bounds the wait, not the hold: it is stopped
		// once the hold is taken.
		actx, acancel := context.WithCancel(ctx)
		timer := time.AfterFunc(stormDeadline(rng), acancel)
		do := rw.RDo
		if write {
			do = rw.Do
		}
		err = do(actx, func(hctx context.Context) error {
			if !timer.Stop() {
				return context.DeadlineExceeded // too late: its context ended
			}
			return round(hctx)
		})
		acancel()
		if errors.Is(err, context.Canceled) {
			err = context.DeadlineExceeded
		}
	}
	if write && err == nil && (took || !try) {
		n.writes.Add(1)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		n.cancelled.Add(1)
		return nil
	}
	return err
}

// TestRWMutexWriterNotStarvedByReaders: relays of readers on two Clients
// keep the lock read without a gap (each relay takes a new read before it
// gives back the last one); a writer still gets in within a bound, since
// the reads asked for after it queue behind it. (A relay whose new read
// does not come within 50 ms gives back its last one, as a reader that
// times out would: otherwise the relay and the writer would wait for each
// other.) Were readers let in past a queued writer, it would never get in.
func TestRWMutexWriterNotStarvedByReaders(t *testing.T) {
	rdb := newReal(t)
	name := uniqueName(t)
	clients := []*Client{newClient(t, rdb), newClient(t, rdb)}
	rctx, stopReaders := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var reads atomic.Int64
	for g := range 4 {
		cur, next := must(clients[g%2].NewRWMutex(name)), must(clients[(g+1)%2].NewRWMutex(name))
		wg.Go(func() { relayReads(rctx, cur, next, &reads) })
	}
	defer func() {
		stopReaders()
		wg.Wait()
	}()
	eventually(t, 5*time.Second, "readers to stream", func() bool { return reads.Load() > 50 })
	w := must(newClient(t, rdb).NewRWMutex(name))
	for range 5 {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := w.Lock(wctx)
		cancel()
		if err != nil {
			t.Fatalf("the writer did not get in within 2 s of a stream of readers (%d reads): %v", reads.Load(), err)
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// relayReads reads with cur and next in turn until ctx ends, each taking
// its read before the other gives back its own.
func relayReads(ctx context.Context, cur, next *RWMutex, reads *atomic.Int64) {
	if cur.RLock(ctx) != nil {
		return
	}
	for {
		nctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := next.RLock(nctx)
		cancel()
		if err != nil {
			_ = cur.RUnlock(context.Background())
			if next.RLock(ctx) != nil {
				return
			}
		} else {
			reads.Add(1)
			time.Sleep(time.Millisecond)
			_ = cur.RUnlock(context.Background())
		}
		cur, next = next, cur
	}
}
