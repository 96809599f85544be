package fault

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/integration/fault/internal/fence"
)

// The lock-set workload's history and its checker. The workload
// (lockset_test.go) runs worker processes that take one lock and, under
// it, read-modify-write a fenced counter and two unfenced ones (plain and
// bounded), while a nemesis kills, pauses and partitions them and restarts
// Redis. Everything is timed by one clock: the processes share a machine,
// and Redis logs each applied write with its own clock, the same one.

// lsHold is one hold of the lock: one goroutine of one worker process,
// from the return of Lock to the moment it stopped believing it held the
// lock.
type lsHold struct {
	worker, g int
	n         int64 // the hold's number in its worker
	token     int64
	long      bool      // asked for by the nemesis, to span a fault
	acq       time.Time // Lock returned
	unlock    time.Time // Unlock called; zero if never
	unlockRes string    // ok, lost or error ...
	lost      time.Time // Lost seen closed; zero if never
	killed    time.Time // its process was SIGKILLed meanwhile; zero if not
}

func (h *lsHold) String() string {
	return fmt.Sprintf("w%d/g%d hold %d (token %d)", h.worker, h.g, h.n, h.token)
}

// end is when the holder stopped believing it held the lock: its Unlock
// call, its Lost closing or its death, whichever came first; a hold that
// shows none of them lasts until the end of the run.
func (h *lsHold) end(runEnd time.Time) time.Time {
	e := runEnd
	for _, t := range []time.Time{h.unlock, h.lost, h.killed} {
		if !t.IsZero() && t.Before(e) {
			e = t
		}
	}
	return e
}

// endReason names what ended the hold.
func (h *lsHold) endReason(runEnd time.Time) string {
	switch e := h.end(runEnd); {
	case !h.lost.IsZero() && e.Equal(h.lost):
		return "Lost"
	case !h.unlock.IsZero() && e.Equal(h.unlock):
		return "Unlock (" + h.unlockRes + ")"
	case !h.killed.IsZero() && e.Equal(h.killed):
		return "SIGKILL"
	}
	return "end of run"
}

// lsOp is one read or write of a counter under a hold.
type lsOp struct {
	hold   *lsHold
	kind   string // fr, fw (fenced read, write), ur, uw (plain), br, bw (bounded)
	op     string // op id: worker.hold.step
	t0, t1 time.Time
	result string // ok, rejected, error or skipped
	value  int64  // read (reads), or the value the write was computed from
	msg    string
}

// lsCall is one Lock call.
type lsCall struct {
	worker, g           int
	call, ret, deadline time.Time
	err                 string // "" when it took the lock
}

// lsFault is one fault of the nemesis. worker is -1 for a Redis restart.
// kill: start = end = the SIGKILL; pause: SIGSTOP to SIGCONT; restart:
// Redis killed to Redis answering again; partition: the worker's
// connection to Redis blackholed to healed.
type lsFault struct {
	kind       string
	worker     int
	start, end time.Time
	target     *lsHold // the hold the nemesis aimed at, if any
}

func (f lsFault) String() string {
	s := f.kind
	if f.worker >= 0 {
		s += fmt.Sprintf(" w%d", f.worker)
	}
	if f.target != nil {
		s += " (holding " + f.target.String() + ")"
	}
	return s
}

// lsHistory is what a run of the workload leaves.
type lsHistory struct {
	lease      time.Duration // the watchdog lease
	heartbeat  time.Duration // fair waiters' heartbeat
	fair       bool
	lostMargin time.Duration // allowed beyond the deadline for Lost to be seen
	lockMargin time.Duration // allowed beyond a Lock call's deadline
	start, end time.Time

	holds  []*lsHold
	ops    []*lsOp
	calls  []lsCall
	faults []lsFault
	errors []string // what the workers reported as errors

	fenced   lsCounter   // checks tokens
	unfenced []lsCounter // plain, bounded: do not
}

// lsCounter is one counter's log of applied writes and its final value.
type lsCounter struct {
	name        string // fenced, plain or bounded (see internal/holder/work.go)
	read, write string // its ops' kinds
	log         []fence.Entry
	value       int64
}

// lsReport is the checker's verdict: violations fail the test; notes are
// what the documented limits allowed, and measurements.
type lsReport struct {
	violations []string
	notes      []string
}

func (r *lsReport) violation(format string, args ...any) {
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

func (r *lsReport) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

// at formats t as milliseconds since the start of the run.
func (h *lsHistory) at(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return fmt.Sprintf("%+.1fms", float64(t.Sub(h.start))/float64(time.Millisecond))
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

// pastLease reports whether f is a pause that may have outlasted a hold's
// lease: one at least two thirds of the lease long (the watchdog renews
// every third of it, so a pause shorter than that cannot outlast a lease
// by itself). Only such a pause is the documented limit.
func (h *lsHistory) pastLease(f lsFault) bool {
	return f.kind == "pause" && f.end.Sub(f.start) >= 2*h.lease/3
}

// paused returns a pause past the lease of worker that began within
// [from, to], if any.
func (h *lsHistory) paused(worker int, from, to time.Time) *lsFault {
	for i, f := range h.faults {
		if h.pastLease(f) && f.worker == worker && !f.start.Before(from) && !f.start.After(to) {
			return &h.faults[i]
		}
	}
	return nil
}

// pausedDuring returns a pause past the lease of worker that overlaps
// [from, to], if any.
func (h *lsHistory) pausedDuring(worker int, from, to time.Time) *lsFault {
	for i, f := range h.faults {
		if h.pastLease(f) && f.worker == worker && !f.start.After(to) && !f.end.Before(from) {
			return &h.faults[i]
		}
	}
	return nil
}

// stoppedDuring reports whether worker was paused at all during [from,
// to]: its process could not act then, so its times say nothing about the
// library.
func (h *lsHistory) stoppedDuring(worker int, from, to time.Time) bool {
	for _, f := range h.faults {
		if f.kind == "pause" && f.worker == worker && !f.start.After(to) && !f.end.Before(from) {
			return true
		}
	}
	return false
}

// faultsAround names the faults whose window (extended by a lease and a
// second of recovery) contains t.
func (h *lsHistory) faultsAround(t time.Time) string {
	var s []string
	for _, f := range h.faults {
		if !t.Before(f.start) && !t.After(f.end.Add(h.lease+time.Second)) {
			s = append(s, fmt.Sprintf("%s [%s, %s]", f, h.at(f.start), h.at(f.end)))
		}
	}
	if len(s) == 0 {
		return "no fault"
	}
	return strings.Join(s, "; ")
}

// describe is a hold with its times.
func (h *lsHistory) describe(x *lsHold) string {
	return fmt.Sprintf("%s [acq %s, end %s by %s; Lost %s, Unlock %s]",
		x, h.at(x.acq), h.at(x.end(h.end)), x.endReason(h.end), h.at(x.lost), h.at(x.unlock))
}

// check runs every check of the history.
func (h *lsHistory) check() *lsReport {
	r := &lsReport{}
	for _, e := range h.errors {
		r.violation("a worker reported: %s", e)
	}
	h.checkTokens(r)
	h.checkOverlaps(r)
	h.checkFaults(r)
	h.checkLockCalls(r)
	h.checkFenced(r)
	h.checkPlain(r)
	return r
}

// checkTokens: every hold has a token of its own, and in token order the
// holds were taken in time order: a hold is granted only after the one
// before it ended, and a Lock call refuses a grant whose lease may have
// run out before it took it (even if its process was paused meanwhile).
func (h *lsHistory) checkTokens(r *lsReport) {
	byToken := append([]*lsHold(nil), h.holds...)
	sort.Slice(byToken, func(i, j int) bool { return byToken[i].token < byToken[j].token })
	for i := 1; i < len(byToken); i++ {
		a, b := byToken[i-1], byToken[i]
		switch {
		case a.token == b.token:
			r.violation("two holds with token %d: %s and %s", a.token, h.describe(a), h.describe(b))
		case !b.acq.After(a.acq):
			r.violation("%s was taken at %s, after %s at %s: tokens do not follow the order of the holds%s (%s)",
				a, h.at(a.acq), b, h.at(b.acq), h.resumed(a), h.faultsAround(a.acq))
		}
	}
}

// resumed says, when x was taken just after its process resumed from a
// pause, that its Lock call returned a grant made before or during it.
func (h *lsHistory) resumed(x *lsHold) string {
	for _, f := range h.faults {
		if f.kind == "pause" && f.worker == x.worker && !x.acq.Before(f.end) && x.acq.Sub(f.end) < h.lease {
			return fmt.Sprintf("; its Lock returned %s after its process was resumed from a pause of %s: a grant made while it was paused",
				ms(x.acq.Sub(f.end)), ms(f.end.Sub(f.start)))
		}
	}
	return ""
}

// checkOverlaps: no two holds believed at once, unless the earlier holder
// was paused (SIGSTOP) past its lease before the later one got the lock:
// that is the documented limit. It is reported, and then the later holds
// must carry higher tokens, and every fenced read or write the paused
// holder made once one of them had claimed the counter must have been
// rejected: fencing is what protects the resource then.
func (h *lsHistory) checkOverlaps(r *lsReport) {
	byAcq := append([]*lsHold(nil), h.holds...)
	sort.Slice(byAcq, func(i, j int) bool { return byAcq[i].acq.Before(byAcq[j].acq) })
	for i, a := range byAcq {
		aEnd := a.end(h.end)
		var during []*lsHold // holds that came in while a was paused
		var p *lsFault
		for _, b := range byAcq[i+1:] {
			if !b.acq.Before(aEnd) {
				break
			}
			if q := h.paused(a.worker, a.acq, b.acq); q != nil && q.start.Before(aEnd) {
				p = q
				during = append(during, b)
				if b.token <= a.token {
					r.violation("%s came in while %s was paused, with a token no higher", h.describe(b), h.describe(a))
				}
				continue
			}
			older := ""
			if b.token < a.token {
				older = fmt.Sprintf(" (the later hold has the lower token%s)", h.resumed(b))
			}
			r.violation("%s and %s believed at once for %s from %s%s; %s",
				h.describe(a), h.describe(b), ms(minTime(aEnd, b.end(h.end)).Sub(b.acq)), h.at(b.acq), older, h.faultsAround(b.acq))
		}
		if len(during) > 0 {
			h.checkStale(r, a, p, during)
		}
	}
}

// checkStale reports a documented pause: a, paused by p, still believed
// while the holds during came in; and checks that the counter's fencing
// rejected a from the first claim of the holds that came in.
func (h *lsHistory) checkStale(r *lsReport, a *lsHold, p *lsFault, during []*lsHold) {
	var claim time.Time // the first fenced read of a hold that came in
	in := map[*lsHold]bool{}
	for _, b := range during {
		in[b] = true
	}
	for _, o := range h.ops {
		if in[o.hold] && o.kind == "fr" && o.result == "ok" && (claim.IsZero() || o.t1.Before(claim)) {
			claim = o.t1
		}
	}
	var rejected, errs, plain, skipped int
	for _, o := range h.ops {
		if o.hold != a || claim.IsZero() || o.t0.Before(claim) {
			continue
		}
		switch {
		case (o.kind == "uw" || o.kind == "bw") && o.result == "ok":
			plain++
		case (o.kind == "uw" || o.kind == "bw") && o.result == "skipped":
			skipped++
		case o.kind[0] != 'f':
		case o.result == "rejected":
			rejected++
		case o.result == "error":
			errs++
		default:
			r.violation("the fenced counter accepted %s %s of %s at %s, after %s had claimed it at %s: fencing failed",
				o.kind, o.op, a, h.at(o.t1), during[0], h.at(claim))
		}
	}
	last := during[len(during)-1]
	r.note("documented pause: %s, SIGSTOPped at %s for %s, still believed while %d holds came in (tokens %d..%d, %s to %s); "+
		"after their first claim, its fenced reads and writes: %d rejected, %d failed, 0 accepted; its unfenced writes: %d sent, %d skipped (Lost seen)",
		h.describe(a), h.at(p.start), ms(p.end.Sub(p.start)), len(during), during[0].token, last.token,
		h.at(during[0].acq), h.at(last.acq), rejected, errs, plain, skipped)
}

// checkFaults: after each fault the affected holds stop believing in time.
//   - partition: every hold of the worker open when its connection was
//     blackholed ends (Lost, or Unlock) within lease + lostMargin of the
//     fault; that it ends before anyone else gets in is checkOverlaps'.
//   - pause past the lease: every hold of the worker open at SIGSTOP ends
//     within lostMargin of SIGCONT.
//   - Redis restart longer than the lease: every hold open when Redis
//     was killed ends within lease + lostMargin.
//   - kill: the lock is free again for the others: the next hold of
//     another worker starts within lease + lostMargin of the SIGKILL (plus
//     a heartbeat and a third, for a fair lock, whose lock may be handed
//     to a dead process's queued call first).
func (h *lsHistory) checkFaults(r *lsReport) {
	for _, f := range h.faults {
		var bound time.Time
		var affected []*lsHold
		for _, x := range h.holds {
			if (f.worker < 0 || x.worker == f.worker) && !x.acq.After(f.start) && x.end(h.end).After(f.start) {
				affected = append(affected, x)
			}
		}
		switch f.kind {
		case "partition":
			bound = f.start.Add(h.lease + h.lostMargin)
		case "pause":
			if f.end.Sub(f.start) > h.lease {
				bound = f.end.Add(h.lostMargin)
			}
		case "restart":
			if f.end.Sub(f.start) > h.lease {
				bound = f.start.Add(h.lease + h.lostMargin)
			}
		case "kill":
			h.checkKill(r, f)
			continue
		}
		if f.target != nil && !containsHold(affected, f.target) {
			r.note("%s at %s: the target hold had ended by then (%s)", f, h.at(f.start), h.describe(f.target))
		}
		for _, x := range affected {
			e := x.end(h.end)
			what := fmt.Sprintf("%s at %s (lasting %s): %s ended %s after the fault, by %s",
				f, h.at(f.start), ms(f.end.Sub(f.start)), x, ms(e.Sub(f.start)), x.endReason(h.end))
			if next := h.nextHold(x, f.start); next != nil {
				rel := ms(next.acq.Sub(e)) + " after it ended"
				if next.acq.Before(e) {
					rel = "while it still believed, " + ms(e.Sub(next.acq)) + " before it ended"
				}
				what += fmt.Sprintf("; the next hold, %s, began %s after the fault (%s)", next, ms(next.acq.Sub(f.start)), rel)
			}
			switch {
			case bound.IsZero():
				r.note("%s (no bound: the fault was shorter than the lease)", what)
			case e.After(bound):
				r.violation("%s, later than the bound %s after the fault", what, ms(bound.Sub(f.start)))
			default:
				r.note("%s, bound %s", what, ms(bound.Sub(f.start)))
			}
		}
	}
}

// checkKill checks that the lock did not stay with a killed process.
func (h *lsHistory) checkKill(r *lsReport, f lsFault) {
	bound := h.lease + h.lostMargin
	if h.fair {
		bound += h.heartbeat + h.heartbeat/3
	}
	var next *lsHold
	for _, x := range h.holds {
		if x.worker != f.worker && x.acq.After(f.start) && (next == nil || x.acq.Before(next.acq)) {
			next = x
		}
	}
	switch {
	case next == nil:
		r.violation("%s at %s: nobody held the lock afterwards", f, h.at(f.start))
	case next.acq.Sub(f.start) > bound:
		r.violation("%s at %s: the next hold, %s, began %s later, over the bound %s",
			f, h.at(f.start), next, ms(next.acq.Sub(f.start)), ms(bound))
	default:
		r.note("%s at %s: the next hold, %s, began %s later (bound %s)", f, h.at(f.start), next, ms(next.acq.Sub(f.start)), ms(bound))
	}
}

// nextHold returns the first hold other than x taken after t, or nil.
func (h *lsHistory) nextHold(x *lsHold, t time.Time) *lsHold {
	var next *lsHold
	for _, y := range h.holds {
		if y != x && y.acq.After(t) && (next == nil || y.acq.Before(next.acq)) {
			next = y
		}
	}
	return next
}

func containsHold(hs []*lsHold, x *lsHold) bool {
	for _, y := range hs {
		if y == x {
			return true
		}
	}
	return false
}

// checkLockCalls: every Lock call returns by its ctx deadline (plus
// lockMargin), unless its process was paused meanwhile; one that returns
// an error after its deadline returns the ctx's (Lock's documentation:
// "When ctx ends first, Lock returns ctx.Err() wrapped").
func (h *lsHistory) checkLockCalls(r *lsReport) {
	var late time.Duration
	var latest lsCall
	for _, c := range h.calls {
		over := c.ret.Sub(c.deadline)
		if over <= 0 || h.stoppedDuring(c.worker, c.call, c.ret) {
			continue
		}
		if over > late {
			late, latest = over, c
		}
		if over > h.lockMargin {
			r.violation("w%d/g%d: Lock called at %s returned %s after its deadline (%s); %s",
				c.worker, c.g, h.at(c.call), ms(over), cmpOr(c.err, "took the lock"), h.faultsAround(c.ret))
		}
		if c.err != "" && !strings.Contains(c.err, context.DeadlineExceeded.Error()) && !strings.Contains(c.err, context.Canceled.Error()) {
			r.violation("w%d/g%d: Lock called at %s returned %s after its deadline with %q, not its ctx's error; %s",
				c.worker, c.g, h.at(c.call), ms(over), c.err, h.faultsAround(c.ret))
		}
	}
	what := ""
	if late > 0 {
		what = fmt.Sprintf(" (w%d/g%d, called at %s: %s; %s)", latest.worker, latest.g, h.at(latest.call),
			cmpOr(latest.err, "took the lock"), h.faultsAround(latest.ret))
	}
	r.note("Lock calls: %d; the latest returned %s after its deadline%s (margin %s)", len(h.calls), ms(late), what, ms(h.lockMargin))
}

// chain walks a counter's log of applied writes: each write must have
// read the value the write before it wrote. It returns the writes that
// did not: breaks, which read less (each overwrote the updates since the
// value it read: lost updates), and rewinds, which read more, a value that
// an earlier write wrote (each read it before the writes after that one
// were applied, and undid them). It reports the other anomalies, such as
// a read of a value that no write wrote.
func (h *lsHistory) chain(r *lsReport, c lsCounter) (breaks, rewinds []int) {
	name, log, final := c.name, c.log, c.value
	seen := map[string]bool{}
	written := map[int64]bool{0: true}
	var prev int64
	for i, e := range log {
		if seen[e.Op] {
			r.violation("%s counter: op %s applied twice", name, e.Op)
		}
		seen[e.Op] = true
		switch {
		case e.Read > prev && written[e.Read]:
			rewinds = append(rewinds, i)
		case e.Read > prev:
			r.violation("%s counter: write %d (op %s) read %d, a value never written (the write before wrote %d)", name, i, e.Op, e.Read, prev)
		case e.Read < prev:
			breaks = append(breaks, i)
		}
		written[e.Wrote] = true
		prev = e.Wrote
	}
	if final != prev {
		r.violation("%s counter holds %d, but its last logged write wrote %d", name, final, prev)
	}
	acked := 0
	for _, o := range h.ops {
		if o.kind == c.write && o.result == "ok" {
			acked++
			if !seen[o.op] {
				r.violation("%s counter: the acknowledged write %s of %s is not in the counter's log: it was lost", name, o.op, o.hold)
			}
		}
	}
	r.note("%s counter: %d writes applied, %d acknowledged, final value %d", name, len(log), acked, final)
	return breaks, rewinds
}

// rewound returns the writes that a rewind (see chain) at i undid: those
// after the last write before i that wrote the value i read.
func rewound(log []fence.Entry, i int) []int {
	j := i - 1
	for j >= 0 && log[j].Wrote != log[i].Read {
		j--
	}
	var undone []int
	for k := j + 1; k < i; k++ {
		undone = append(undone, k)
	}
	return undone
}

// opOf finds the op event of an op id and kind.
func (h *lsHistory) opOf(id, kind string) *lsOp {
	for _, o := range h.ops {
		if o.op == id && o.kind == kind {
			return o
		}
	}
	return nil
}

// checkFenced: no fenced update is ever lost, and a fenced counter
// rejects a holder only when that holder had seen Lost or was paused.
func (h *lsHistory) checkFenced(r *lsReport) {
	breaks, rewinds := h.chain(r, h.fenced)
	for _, i := range append(breaks, rewinds...) {
		e, p := h.fenced.log[i], h.fenced.log[i-1]
		r.violation("fenced counter: a lost update: write %d (op %s, token %d, at %s) read %d, but write %d (op %s, token %d, at %s) had written %d",
			i, e.Op, e.Token, h.at(e.At), e.Read, i-1, p.Op, p.Token, h.at(p.At), p.Wrote)
	}
	rejected := 0
	for _, o := range h.ops {
		if (o.kind != "fr" && o.kind != "fw") || o.result != "rejected" {
			continue
		}
		rejected++
		x := o.hold
		switch {
		case !x.lost.IsZero() && !x.lost.After(o.t1):
		case h.pausedDuring(x.worker, x.acq, o.t1) != nil:
		default:
			r.violation("fenced counter rejected %s %s of %s at %s, whose Lost was still open (a higher token had the counter while it believed it held the lock): %s; %s",
				o.kind, o.op, x, h.at(o.t1), h.describe(x), h.faultsAround(o.t1))
		}
	}
	r.note("fenced counter: %d reads or writes rejected, each of a holder that had seen Lost or was paused", rejected)
}

// checkPlain: an unfenced update may be lost only when its writer was
// paused (SIGSTOP) past its lease between its read and its write, or, for
// the plain counter (whose write has a timeout of its own), when the
// write was sent before its writer's Lost closed and applied after (held
// up on its way, by a Redis restart for instance): both are documented
// non-guarantees, reported. The bounded counter's write ends with Lost, so
// it may not be lost that way. Any other loss is a violation. A write that
// read before such a stale write was applied, and wrote after, undoes it
// (a rewind): documented when every write it undid is a documented stale
// one, a violation otherwise.
func (h *lsHistory) checkPlain(r *lsReport) {
	for _, c := range h.unfenced {
		lost := 0
		breaks, rewinds := h.chain(r, c)
		documented := map[int]bool{}
		for _, i := range breaks {
			e, p := c.log[i], c.log[i-1]
			n := p.Wrote - e.Read
			what := fmt.Sprintf("%s counter: %d updates lost: write %d (op %s, applied at %s) read %d, but write %d (op %s, at %s) had written %d",
				c.name, n, i, e.Op, h.at(e.At), e.Read, i-1, p.Op, h.at(p.At), p.Wrote)
			read, write := h.opOf(e.Op, c.read), h.opOf(e.Op, c.write)
			if read == nil {
				r.violation("%s; the write's read was never reported", what)
				continue
			}
			x := read.hold
			what += fmt.Sprintf("; the stale writer %s read at %s", h.describe(x), h.at(read.t0))
			inFlight := false
			if write != nil {
				what += fmt.Sprintf(", sent its write at %s (reply at %s)", h.at(write.t0), h.at(write.t1))
				if !x.lost.IsZero() && write.t0.Before(x.lost) && e.At.After(x.lost) {
					inFlight = true
					what += fmt.Sprintf(", before its Lost closed at %s: the write was in flight for %s and applied %s after Lost",
						h.at(x.lost), ms(e.At.Sub(write.t0)), ms(e.At.Sub(x.lost)))
				}
			}
			if inFlight && c.name == "plain" {
				lost += int(n)
				documented[i] = true
				r.note("documented: a write in flight when Lost closed: %s", what)
				continue
			}
			if q := h.pausedDuring(x.worker, read.t0, e.At); q != nil {
				lost += int(n)
				documented[i] = true
				r.note("documented pause: %s; w%d was SIGSTOPped [%s, %s] between its read and its write", what, x.worker, h.at(q.start), h.at(q.end))
				continue
			}
			if next := h.nextHold(x, x.end(h.end)); next != nil {
				what += fmt.Sprintf("; the next hold, %s, began at %s", next, h.at(next.acq))
			}
			r.violation("%s; %s", what, h.faultsAround(e.At))
		}
		for _, i := range rewinds {
			e, undone := c.log[i], rewound(c.log, i)
			what := fmt.Sprintf("%s counter: write %d (op %s, applied at %s) read %d, written before writes %v, which it undid",
				c.name, i, e.Op, h.at(e.At), e.Read, undone)
			stale := true
			for _, k := range undone {
				stale = stale && documented[k]
			}
			if stale {
				r.note("documented: %s, each a stale write reported above", what)
				continue
			}
			r.violation("%s; %s", what, h.faultsAround(e.At))
		}
		r.note("%s counter: %d updates lost across pauses or by writes in flight when Lost closed (documented)", c.name, lost)
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// TestLockSetCheckerRejectsViolations feeds the checker small histories
// that break each rule once, and one that keeps them all (with a
// documented pause), so that the checker itself is known to fail.
func TestLockSetCheckerRejectsViolations(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	entry := func(op string, token, read int64, ms int) fence.Entry {
		return fence.Entry{Op: op, Token: token, Read: read, Wrote: read + 1, At: at(ms)}
	}
	// valid: w0 holds token 1, is paused past its lease, w1 takes token 2
	// meanwhile; w0's stale fenced write is rejected after its Lost, its
	// stale unfenced write overwrites w1's update (documented).
	valid := func() *lsHistory {
		a := &lsHold{worker: 0, n: 1, token: 1, acq: at(0), lost: at(1620), unlock: at(1625), unlockRes: "lost"}
		b := &lsHold{worker: 1, n: 1, token: 2, acq: at(1200), unlock: at(1300), unlockRes: "ok"}
		return &lsHistory{
			lease: time.Second, heartbeat: time.Second, lostMargin: 250 * time.Millisecond, lockMargin: 150 * time.Millisecond,
			start: t0, end: at(3000),
			holds: []*lsHold{a, b},
			ops: []*lsOp{
				{hold: a, kind: "fr", op: "0.1.0", t0: at(10), t1: at(11), result: "ok", value: 0},
				{hold: a, kind: "fw", op: "0.1.0", t0: at(12), t1: at(13), result: "ok", value: 0},
				{hold: a, kind: "ur", op: "0.1.0", t0: at(14), t1: at(15), result: "ok", value: 0},
				{hold: b, kind: "fr", op: "1.1.0", t0: at(1201), t1: at(1202), result: "ok", value: 1},
				{hold: b, kind: "fw", op: "1.1.0", t0: at(1203), t1: at(1204), result: "ok", value: 1},
				{hold: b, kind: "ur", op: "1.1.0", t0: at(1205), t1: at(1206), result: "ok", value: 0},
				{hold: b, kind: "uw", op: "1.1.0", t0: at(1207), t1: at(1208), result: "ok", value: 0},
				{hold: a, kind: "uw", op: "0.1.0", t0: at(16), t1: at(1611), result: "ok", value: 0},
				{hold: a, kind: "fr", op: "0.1.1", t0: at(1612), t1: at(1630), result: "rejected", value: 2},
			},
			calls:  []lsCall{{worker: 0, call: at(0), ret: at(0), deadline: at(2000)}, {worker: 1, call: at(100), ret: at(1200), deadline: at(2100)}},
			faults: []lsFault{{kind: "pause", worker: 0, start: at(20), end: at(1600)}},
			fenced: lsCounter{name: "fenced", read: "fr", write: "fw", value: 2,
				log: []fence.Entry{entry("0.1.0", 1, 0, 13), entry("1.1.0", 2, 1, 1204)}},
			unfenced: []lsCounter{{name: "plain", read: "ur", write: "uw", value: 1,
				log: []fence.Entry{entry("1.1.0", 0, 0, 1208), entry("0.1.0", 0, 0, 1610)}}},
		}
	}
	h := valid()
	if r := h.check(); len(r.violations) != 0 {
		t.Fatalf("valid history rejected: %q", r.violations)
	}

	for name, tc := range map[string]struct {
		breakIt func(h *lsHistory)
		want    string // in some violation
	}{
		"no pause": {func(h *lsHistory) { h.faults = nil }, "believed at once"},
		"unfenced update lost without a pause": {func(h *lsHistory) {
			h.faults = []lsFault{{kind: "pause", worker: 0, start: at(20), end: at(30)}}
		}, "plain counter: 1 updates lost"},
		"same token": {func(h *lsHistory) { h.holds[1].token = 1 }, "two holds with token 1"},
		"stale grant after a pause": {func(h *lsHistory) {
			// w0's other goroutine comes back from the pause with a
			// token older than w1's.
			h.holds = append(h.holds, &lsHold{worker: 0, g: 1, n: 2, token: 0, acq: at(1601), unlock: at(1610)})
		}, "a grant made while it was paused"},
		"late Lost after a partition": {func(h *lsHistory) { h.faults[0].kind = "partition" }, "later than the bound"},
		"late Lock":                   {func(h *lsHistory) { h.calls[1].ret = h.calls[1].deadline.Add(time.Second) }, "after its deadline ("},
		"Lock error after the deadline": {func(h *lsHistory) {
			h.calls[1].ret, h.calls[1].err = h.calls[1].deadline.Add(time.Millisecond), "EOF"
		}, "not its ctx's error"},
		"fenced lost update": {func(h *lsHistory) {
			h.fenced.log[1].Read, h.fenced.log[1].Wrote, h.fenced.value = 0, 1, 1
		}, "fenced counter: a lost update"},
		"acknowledged fenced write missing": {func(h *lsHistory) {
			h.fenced.log, h.fenced.value = h.fenced.log[:1], 1
		}, "is not in the counter's log"},
		"rejected while believing": {func(h *lsHistory) { h.holds[0].lost, h.faults = at(1700), nil }, "whose Lost was still open"},
		"killed lock stays taken": {func(h *lsHistory) {
			h.faults = append(h.faults, lsFault{kind: "kill", worker: 1, start: at(1300), end: at(1300)})
		}, "nobody held the lock afterwards"},
		"worker error":               {func(h *lsHistory) { h.errors = []string{"error boom"} }, "a worker reported"},
		"stale fenced read accepted": {func(h *lsHistory) { h.ops[len(h.ops)-1].result = "ok" }, "fencing failed"},
	} {
		h := valid()
		tc.breakIt(h)
		r := h.check()
		found := false
		for _, v := range r.violations {
			found = found || strings.Contains(v, tc.want)
		}
		if !found {
			t.Errorf("%s: no violation says %q; violations %q", name, tc.want, r.violations)
		}
	}
}

// TestLockSetCheckerRewind: a stale write (w0's, paused past its lease)
// lands between the read and the write of a later holder's update, which
// then undoes it. The checker documents both with the pause, and finds
// both without it. (Seen in CI: a plain write held up by a Redis restart,
// applied between another holder's read and write.)
func TestLockSetCheckerRewind(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	entry := func(op string, read int64, ms int) fence.Entry {
		return fence.Entry{Op: op, Read: read, Wrote: read + 1, At: at(ms)}
	}
	history := func() *lsHistory {
		a := &lsHold{worker: 0, n: 1, token: 1, acq: at(0), lost: at(1620), unlock: at(1625), unlockRes: "lost"}
		b := &lsHold{worker: 1, n: 1, token: 2, acq: at(1200), unlock: at(1300), unlockRes: "ok"}
		c := &lsHold{worker: 1, n: 2, token: 3, acq: at(1400), unlock: at(1500), unlockRes: "ok"}
		d := &lsHold{worker: 1, n: 3, token: 4, acq: at(1602), unlock: at(1700), unlockRes: "ok"}
		return &lsHistory{
			lease: time.Second, heartbeat: time.Second, lostMargin: 250 * time.Millisecond, lockMargin: 150 * time.Millisecond,
			start: t0, end: at(3000),
			holds: []*lsHold{a, b, c, d},
			ops: []*lsOp{
				{hold: a, kind: "ur", op: "0.1.0", t0: at(14), t1: at(15), result: "ok", value: 0},
				{hold: b, kind: "ur", op: "1.1.0", t0: at(1205), t1: at(1206), result: "ok", value: 0},
				{hold: b, kind: "uw", op: "1.1.0", t0: at(1207), t1: at(1208), result: "ok", value: 0},
				{hold: c, kind: "ur", op: "1.2.0", t0: at(1405), t1: at(1406), result: "ok", value: 1},
				{hold: c, kind: "uw", op: "1.2.0", t0: at(1407), t1: at(1408), result: "ok", value: 1},
				{hold: d, kind: "ur", op: "1.3.0", t0: at(1605), t1: at(1606), result: "ok", value: 2},
				{hold: a, kind: "uw", op: "0.1.0", t0: at(16), t1: at(1611), result: "ok", value: 0},
				{hold: d, kind: "uw", op: "1.3.0", t0: at(1612), t1: at(1615), result: "ok", value: 2},
			},
			calls:  []lsCall{{worker: 0, call: at(0), ret: at(0), deadline: at(2000)}, {worker: 1, call: at(100), ret: at(1200), deadline: at(2100)}},
			faults: []lsFault{{kind: "pause", worker: 0, start: at(20), end: at(1600)}},
			unfenced: []lsCounter{{name: "plain", read: "ur", write: "uw", value: 3,
				log: []fence.Entry{entry("1.1.0", 0, 1208), entry("1.2.0", 1, 1408), entry("0.1.0", 0, 1610), entry("1.3.0", 2, 1615)}}},
		}
	}
	r := history().check()
	if len(r.violations) != 0 {
		t.Fatalf("a documented stale write and the update that undid it rejected: %q", r.violations)
	}
	if !slices.ContainsFunc(r.notes, func(n string) bool { return strings.Contains(n, "which it undid") }) {
		t.Errorf("the rewind is not reported: notes %q", r.notes)
	}
	h := history()
	h.faults = nil
	r = h.check()
	if !slices.ContainsFunc(r.violations, func(v string) bool { return strings.Contains(v, "which it undid") }) {
		t.Errorf("without the pause, the rewind is not a violation: %q", r.violations)
	}
}
