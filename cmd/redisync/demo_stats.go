// The demo's live figures, fed by the library's Observer.

package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/redisync/redisync"
)

// statsWindow is how far back the live wait percentiles and rate look.
const statsWindow = time.Second

// demoStats is a redisync.Observer that keeps, per primitive, the figures
// the demo shows while it runs: calls waiting now, the wait of the
// acquisitions of the last second (p50, p99), their rate, and the holds
// lost. It is what an application would export as metrics (see the module
// github.com/redisync/redisync/redisyncotel), kept in memory. It is safe for
// concurrent use.
type demoStats struct {
	mu    sync.Mutex
	prims map[redisync.Primitive]*primStats
}

// primStats are the figures of one primitive.
type primStats struct {
	waiting  int64
	lost     int64
	recent   []time.Duration // waits of acquisitions since the last snapshot
	since    time.Time       // of the last snapshot (or the first call)
	window   []statsBucket   // the snapshots of the last statsWindow
	all      []time.Duration // every wait, for the summary
	acquired int64
}

// statsBucket is what one snapshot took from recent: the waits of the
// acquisitions since from.
type statsBucket struct {
	from  time.Time
	waits []time.Duration
}

// figures are the live figures of one primitive at a snapshot.
type figures struct {
	Waiting  int64
	P50, P99 time.Duration // of the waits of the last statsWindow (or less)
	Rate     float64       // acquisitions per second over the same time
	Lost     int64         // since the start
}

func newDemoStats() *demoStats {
	return &demoStats{prims: map[redisync.Primitive]*primStats{}}
}

// of returns the figures of prim, creating them. s.mu must be held.
func (s *demoStats) of(prim redisync.Primitive) *primStats {
	p := s.prims[prim]
	if p == nil {
		p = &primStats{since: time.Now()}
		s.prims[prim] = p
	}
	return p
}

// CallStart counts a Lock, RLock or Acquire that starts waiting.
func (s *demoStats) CallStart(ctx context.Context, c redisync.CallInfo) context.Context {
	if waits(c.Op) {
		s.mu.Lock()
		s.of(c.Primitive).waiting++
		s.mu.Unlock()
	}
	return ctx
}

// CallEnd records the wait of a Lock, RLock or Acquire.
func (s *demoStats) CallEnd(_ context.Context, c redisync.CallInfo) {
	if !waits(c.Op) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.of(c.Primitive)
	p.waiting--
	if c.Outcome == redisync.OutcomeAcquired {
		p.recent = append(p.recent, c.Duration)
		p.all = append(p.all, c.Duration)
		p.acquired++
	}
}

// waits reports whether op is a call that waits for a hold.
func waits(op redisync.Op) bool {
	return op == redisync.OpLock || op == redisync.OpAcquire || op == redisync.OpRLock
}

// Event counts the holds lost.
func (s *demoStats) Event(e redisync.Event) {
	if e.Kind == redisync.EventHoldLost {
		s.mu.Lock()
		s.of(e.Primitive).lost++
		s.mu.Unlock()
	}
}

// snapshot returns the figures of every primitive at now.
func (s *demoStats) snapshot(now time.Time) map[redisync.Primitive]figures {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[redisync.Primitive]figures, len(s.prims))
	for prim, p := range s.prims {
		p.window = append(p.window, statsBucket{from: p.since, waits: p.recent})
		p.recent, p.since = nil, now
		for len(p.window) > 1 && now.Sub(p.window[0].from) > statsWindow {
			p.window = p.window[1:]
		}
		var waits []time.Duration
		for _, b := range p.window {
			waits = append(waits, b.waits...)
		}
		slices.Sort(waits)
		f := figures{Waiting: p.waiting, P50: quantile(waits, 0.50), P99: quantile(waits, 0.99), Lost: p.lost}
		if span := now.Sub(p.window[0].from); span > 0 {
			f.Rate = float64(len(waits)) / span.Seconds()
		}
		out[prim] = f
	}
	return out
}

// overall returns, for the summary, the p50 and p99 of every wait of prim
// since the start, and how many holds were lost.
func (s *demoStats) overall(prim redisync.Primitive) (p50, p99 time.Duration, lost int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.of(prim)
	waits := slices.Clone(p.all)
	slices.Sort(waits)
	return quantile(waits, 0.50), quantile(waits, 0.99), p.lost
}

// quantile returns the q-quantile of sorted (nearest rank), or 0.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// line is the live view's line of f.
func (f figures) line() string {
	return fmt.Sprintf("    live      waiting %-3d wait p50 %-7s p99 %-7s (last %v)   %4.0f acquisitions/s   lost %d",
		f.Waiting, msText(f.P50), msText(f.P99), statsWindow, f.Rate, f.Lost)
}

// brief is the progress line's fragment of f.
func (f figures) brief() string {
	return fmt.Sprintf(", waiting %d, wait p50 %s p99 %s, lost %d", f.Waiting, msText(f.P50), msText(f.P99), f.Lost)
}

// msText writes d in ms, to a tenth below 10 ms.
func msText(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms < 10 {
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.0fms", ms)
}

// metricsHeader is the first line of the file of --metrics-out.
const metricsHeader = "elapsed_s,primitive,waiting,wait_p50_ms,wait_p99_ms,acquisitions_per_s,lost\n"

// writeFigures appends one line per primitive of snap to w, in the order
// of prims.
func writeFigures(w io.Writer, elapsed time.Duration, prims []redisync.Primitive, snap map[redisync.Primitive]figures) error {
	for _, prim := range prims {
		f := snap[prim]
		_, err := fmt.Fprintf(w, "%.1f,%s,%d,%.3f,%.3f,%.1f,%d\n", elapsed.Seconds(), prim, f.Waiting,
			float64(f.P50)/float64(time.Millisecond), float64(f.P99)/float64(time.Millisecond), f.Rate, f.Lost)
		if err != nil {
			return err
		}
	}
	return nil
}
