package redisync

import (
	"context"
	"errors"
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
	owner      int
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

// check fails the test when a write overlaps any hold of another owner,
// or when write tokens do not increase in the order the writes started
// (writes of one owner that overlap share its token). It returns how many
// pairs of reads of different owners overlapped.
func (h *rwHistory) check(t *testing.T) (sharedReads int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := slices.Clone(h.spans)
	slices.SortFunc(s, func(a, b rwSpan) int { return a.start.Compare(b.start) })
	var lastToken int64
	lastOwner := -1
	for i, a := range s {
		if a.write {
			if a.token < lastToken || (a.token == lastToken && a.owner != lastOwner) {
				t.Errorf("write of owner %d started after a write with token %d but has token %d", a.owner, lastToken, a.token)
			}
			lastToken, lastOwner = a.token, a.owner
		}
		for _, b := range s[i+1:] {
			if !b.start.Before(a.end) {
				break
			}
			if a.owner == b.owner {
				continue
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
// 0-5 ms (some 100 ms), hold a little, re-enter, and downgrade writes to
// reads: in "own", each goroutine with a RWMutex value of its own; in
// "shared", 4 of them share a value by two (an owner: its levels add up,
// and a write asked for while the other goroutine reads is refused with
// ErrUpgrade). No write may overlap another owner's hold, write tokens
// must increase, and afterwards the lock must be free and its queue empty.
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
	var cancelled, writes, downgrades, upgrades atomic.Int64
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	vs := make([]*RWMutex, values)
	for v := range vs {
		vs[v] = clients[v%len(clients)].NewRWMutex(name, WithHeartbeat(300*time.Millisecond))
	}
	shared := 12 - values // values 0..shared-1 have two goroutines
	for g := range 12 {
		owner := g % values
		rng := rand.New(rand.NewPCG(seed, uint64(g)))
		wg.Go(func() {
			for time.Now().Before(stop) {
				err := stormRound(vs[owner], owner, rng, &h, &cancelled, &writes, &downgrades)
				if errors.Is(err, ErrUpgrade) && owner < shared {
					upgrades.Add(1)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	reads := h.check(t)
	t.Logf("%d holds, %d writes, %d downgrades, %d upgrades refused, %d calls cancelled, %d overlapping reads",
		len(h.spans), writes.Load(), downgrades.Load(), upgrades.Load(), cancelled.Load(), reads)
	if writes.Load() == 0 || downgrades.Load() == 0 || cancelled.Load() == 0 || reads == 0 || (shared > 0 && upgrades.Load() == 0) {
		t.Error("the storm exercised too little")
	}
	keys := schema.RWMutexKeys(schema.DefaultPrefix, name)
	eventually(t, 5*time.Second, "the lock to be free and its queue empty", func() bool {
		n, err := rdb.Exists(ctx, keys.Holders, keys.Queue).Result()
		return err == nil && n == 0
	})
}

// stormRound makes one call of the storm and, when it took a hold, holds
// it a little and releases it.
func stormRound(rw *RWMutex, owner int, rng *rand.Rand, h *rwHistory, cancelled, writes, downgrades *atomic.Int64) error {
	write := rng.IntN(4) == 0
	try := rng.IntN(4) == 0
	cctx, cancel := context.WithTimeout(ctx, stormDeadline(rng))
	var ok bool
	var err error
	switch {
	case write && try:
		ok, err = rw.TryLock(cctx)
	case write:
		err = rw.Lock(cctx)
		ok = err == nil
	case try:
		ok, err = rw.TryRLock(cctx)
	default:
		err = rw.RLock(cctx)
		ok = err == nil
	}
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		cancelled.Add(1)
		return nil
	}
	if err != nil || !ok {
		return err
	}
	span := rwSpan{owner: owner, write: write, token: rw.Token(), start: time.Now()}
	lost := rw.Lost()
	hold := func() { time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond) }
	end := func(s rwSpan) rwSpan {
		s.end = time.Now()
		select {
		case <-lost:
			s.end = s.start // lost: the hold is not counted on
		default:
		}
		return s
	}
	hold()
	if !write {
		h.add(end(span))
		return rw.RUnlock(ctx)
	}
	writes.Add(1)
	if rng.IntN(2) == 0 { // re-enter: a read under the write, then downgrade
		if err := rw.RLock(ctx); err != nil {
			return err
		}
		hold()
		h.add(end(span))
		if err := rw.Unlock(ctx); err != nil {
			return err
		}
		downgrades.Add(1)
		read := rwSpan{owner: owner, start: time.Now()}
		hold()
		h.add(end(read))
		return rw.RUnlock(ctx)
	}
	h.add(end(span))
	return rw.Unlock(ctx)
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
		cur, next := clients[g%2].NewRWMutex(name), clients[(g+1)%2].NewRWMutex(name)
		wg.Go(func() { relayReads(rctx, cur, next, &reads) })
	}
	defer func() {
		stopReaders()
		wg.Wait()
	}()
	eventually(t, 5*time.Second, "readers to stream", func() bool { return reads.Load() > 50 })
	w := newClient(t, rdb).NewRWMutex(name)
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
