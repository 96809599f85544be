package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress reports on stderr which run is going and how far it is: a
// line redrawn in place on a terminal, and one line per finished run.
type progress struct {
	w     io.Writer
	tty   bool
	total int
	done  int
	label string
}

// newProgress reports on f about total runs.
func newProgress(f *os.File, total int) *progress {
	st, err := f.Stat()
	return &progress{w: f, tty: err == nil && st.Mode()&os.ModeCharDevice != 0, total: total}
}

// start names the run that begins.
func (p *progress) start(label string) { p.label = label }

// update redraws the current run's line, on a terminal.
func (p *progress) update(elapsed, planned time.Duration, acquired int64) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K[%d/%d] %s  %.1f/%.1fs  %d acquisitions",
			p.done+1, p.total, p.label, elapsed.Seconds(), planned.Seconds(), acquired)
	}
}

// finish reports the current run's outcome.
func (p *progress) finish(r result) {
	p.done++
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
	fmt.Fprintf(p.w, "[%d/%d] %s: %.0f acq/s, wait p99 %s, %s cmds/acq, %d violations, %d errors, %d keys left with a TTL\n",
		p.done, p.total, p.label, r.rate, fmtDur(r.wait.quantile(0.99)), fmtNum(r.cmds, 2), r.violations, r.errors, r.left)
	if len(r.persistent) > 0 {
		fmt.Fprintf(p.w, "  %s LEFT %d KEYS WITHOUT A TTL: %s\n", r.library, len(r.persistent), sample(r.persistent))
	}
}

// floor reports the floor measured at the start of a round.
func (p *progress) floor(prefix string, floor []result) {
	fmt.Fprintf(p.w, "%sfloor:", prefix)
	for i, r := range floor {
		if i > 0 {
			fmt.Fprint(p.w, ",")
		}
		fmt.Fprintf(p.w, " %s p50 %s (Redis CPU %s)", r.library, fmtDur(r.op.quantile(0.5)), fmtMicros(r.cpu))
	}
	fmt.Fprintln(p.w)
}
