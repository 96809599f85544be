package watchdog

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Holds taken one after another, their renewals spread evenly over a
// renewal interval, are renewed in about ceil(n/Batch) calls per
// interval (not a few entries per call), each before its deadline, and no
// entry much more often than every two thirds of its interval (at least
// half of it is asserted, for the scheduling jitter of a loaded machine).
// On a cluster too, when they share a hash slot.
func TestStaggeredHoldsAreRenewedInFullBatches(t *testing.T) {
	for _, sharded := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "sharded"}[sharded], func(t *testing.T) {
			testStaggeredHolds(t, sharded)
		})
	}
}

func testStaggeredHolds(t *testing.T, sharded bool) {
	const (
		n     = 2000
		lease = 600 * time.Millisecond
		every = lease / 3
		turns = 4 // renewals of each entry to watch
	)
	type call struct {
		at   time.Time
		size int
	}
	var (
		mu      sync.Mutex
		calls   []call
		last    = make(map[*Entry]time.Time) // each entry's last renewal (or its registration)
		count   = make(map[*Entry]int)       // its renewals
		late    []time.Duration              // how long after its deadline an entry was renewed
		soon    time.Duration                // the shortest time between two renewals of an entry
		done    = make(chan struct{})
		watched int // entries renewed turns times
		closing atomic.Bool
		lost    atomic.Int64
	)
	soon = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := New(ctx, Config{Sharded: sharded, Renew: func(ctx context.Context, batch []Renewal) ([]int64, error) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{at: now, size: len(batch)})
		res := make([]int64, len(batch)+1)
		for i, r := range batch {
			res[i] = 1
			prev := last[r.e]
			if d := now.Sub(prev.Add(lease - Drift(lease))); d >= 0 {
				late = append(late, d)
			}
			if count[r.e] > 0 {
				soon = min(soon, now.Sub(prev))
			}
			last[r.e] = now
			count[r.e]++
			if count[r.e] == turns {
				watched++
				if watched == n {
					close(done)
				}
			}
		}
		res[len(batch)] = now.UnixMilli()
		return res, nil
	}})

	// Registered as if taken one after another over the last interval:
	// their renewals fall due evenly over the next.
	start := time.Now()
	mu.Lock()
	for i := range n {
		sent := start.Add(-every + every*time.Duration(i)/n)
		e := &Entry{Kind: "hold", Owner: "o", Keys: []string{fmt.Sprintf("{k}:%d", i)}, TTL: lease, Hold: true, Renew: true,
			Gone: func() {
				if !closing.Load() {
					lost.Add(1)
				}
			}}
		last[e] = sent
		if !w.Add(e, sent, lease) {
			t.Fatal("Add refused")
		}
	}
	mu.Unlock()

	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the entries were not renewed %d times in 10 s", turns)
	}
	end := time.Now()
	closing.Store(true)
	cancel()
	w.Wait()

	mu.Lock()
	defer mu.Unlock()
	if l := lost.Load(); l > 0 {
		t.Errorf("%d holds reported lost", l)
	}
	if len(late) > 0 {
		t.Errorf("%d renewals were sent after their entry's deadline (by up to %v)", len(late), slices.Max(late))
	}
	if soon < every/2 {
		t.Errorf("an entry was renewed %v after its previous renewal; want at least %v (a renewal interval of %v)", soon, every/2, every)
	}
	// Calls from the end of the first interval (whose start is uneven:
	// a sixth of the entries were due at once) for up to two intervals.
	from, to := start.Add(every), minTime(start.Add(3*every), end)
	var in, entries int
	for _, c := range calls {
		if !c.at.Before(from) && c.at.Before(to) {
			in++
			entries += c.size
		}
	}
	perPeriod := float64(in) / (float64(to.Sub(from)) / float64(every))
	want := float64((n + Batch - 1) / Batch)
	t.Logf("%d calls in all; %.1f calls per renewal interval (%d entries renewed in %v), want about %.0f", len(calls), perPeriod, entries, to.Sub(from).Round(time.Millisecond), want)
	if perPeriod > 3*want {
		t.Errorf("%.1f calls per renewal interval for %d entries; want at most %.0f (3 × ceil(%d/%d))", perPeriod, n, 3*want, n, Batch)
	}
}
