// Package history checks histories of lock holds recorded from outside a
// lock: each hold is an interval of the test's monotonic clock, from just
// after the call that granted it returned to just before the call that
// released it was made (or to when its holder saw Lost close, if earlier).
// A recorded interval is thus inside the real hold, so two recorded
// intervals that overlap prove two real holds that overlapped.
//
// Owners are what a lock excludes from each other: for a lock, the
// goroutine that held (goroutines that share a lock value exclude each
// other); for a semaphore, its value (permits taken through one value add
// up), whose intervals may overlap each other.
package history

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Hold is one recorded hold.
type Hold struct {
	Owner   string    // the lock value that held
	Who     string    // the goroutine that held, for messages
	Start   time.Time // just after the grant returned
	End     time.Time // just before the release, or when Lost was seen
	Token   int64     // fencing token; 0: none (not checked)
	Permits int64     // semaphore permits held; 0 counts as 1
	Lost    bool      // the interval ended because Lost was seen
}

func (h Hold) String() string { return h.Format(time.Time{}) }

// Format describes h with its times as offsets from base, or as times of
// day when base is zero.
func (h Hold) Format(base time.Time) string {
	at := func(t time.Time) string {
		if base.IsZero() {
			return t.Format("15:04:05.000000")
		}
		return "+" + t.Sub(base).Round(time.Microsecond).String()
	}
	s := fmt.Sprintf("%s/%s [%s, %s]", h.Owner, h.Who, at(h.Start), at(h.End))
	if h.Token != 0 {
		s += fmt.Sprintf(" token %d", h.Token)
	}
	if h.Permits != 0 {
		s += fmt.Sprintf(" permits %d", h.Permits)
	}
	if h.Lost {
		s += " (lost)"
	}
	return s
}

func (h Hold) permits() int64 { return max(h.Permits, 1) }

// Violation is one breach of mutual exclusion found in a history.
type Violation struct {
	Kind  string // "overlap", "token order", "capacity"
	Holds []Hold // the holds involved
	At    time.Time
	Note  string
}

func (v Violation) String() string { return v.Format(time.Time{}) }

// Format describes v with times as offsets from base (see Hold.Format).
func (v Violation) Format(base time.Time) string {
	s := v.Kind
	if v.Note != "" {
		s += " (" + v.Note + ")"
	}
	for _, h := range v.Holds {
		s += "\n\t" + h.Format(base)
	}
	return s
}

// Mutex checks a history of one lock: holds of different owners must not
// overlap, and tokens must follow the order in which the holds started
// (the grant order): a hold has a larger token than every hold of another
// owner that started before it, and no smaller a token than the earlier
// holds of its own owner (which may share its token). Holds with a zero
// token are only checked for overlap. It returns the violations in the
// order of the holds' starts.
func Mutex(holds []Hold) []Violation {
	var vs []Violation
	byStart := slices.Clone(holds)
	slices.SortStableFunc(byStart, func(a, b Hold) int { return a.Start.Compare(b.Start) })

	var active []Hold // holds not ended when the current one starts
	// The largest token among the holds started so far, and the largest
	// among those of other owners than its.
	var top, second Hold
	for _, b := range byStart {
		active = slices.DeleteFunc(active, func(a Hold) bool { return !a.End.After(b.Start) })
		for _, a := range active {
			if a.Owner != b.Owner {
				vs = append(vs, Violation{Kind: "overlap", Holds: []Hold{a, b}, At: b.Start,
					Note: fmt.Sprintf("%v together", minTime(a.End, b.End).Sub(b.Start))})
			}
		}
		active = append(active, b)
		if b.Token == 0 {
			continue
		}
		other := top
		if top.Owner == b.Owner {
			other = second
		}
		switch {
		case other.Token != 0 && other.Token >= b.Token:
			vs = append(vs, Violation{Kind: "token order", Holds: []Hold{other, b}, At: b.Start,
				Note: fmt.Sprintf("token %d granted after %d of another owner", b.Token, other.Token)})
		case top.Owner == b.Owner && top.Token > b.Token:
			vs = append(vs, Violation{Kind: "token order", Holds: []Hold{top, b}, At: b.Start,
				Note: fmt.Sprintf("token %d after %d of the same owner", b.Token, top.Token)})
		}
		switch {
		case b.Token > top.Token:
			if top.Owner != b.Owner {
				second = top
			}
			top = b
		case b.Owner != top.Owner && b.Token > second.Token:
			second = b
		}
	}
	return vs
}

// Semaphore checks a history of one semaphore of size permits: at no
// instant may the permits of the holds then running add up to more than
// size. A hold ending at the instant another starts does not overlap it.
// It returns one violation per excursion above size, taken at its peak.
func Semaphore(holds []Hold, size int64) []Violation {
	type event struct {
		at    time.Time
		delta int64
		i     int // index in holds
	}
	evs := make([]event, 0, 2*len(holds))
	for i, h := range holds {
		evs = append(evs, event{h.Start, h.permits(), i}, event{h.End, -h.permits(), i})
	}
	slices.SortStableFunc(evs, func(a, b event) int {
		// Ends before starts at the same instant.
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.delta, b.delta))
	})
	var vs []Violation
	var used, peak int64 // peak: of the current excursion; 0: none
	running := map[int]bool{}
	for _, e := range evs {
		used += e.delta
		if e.delta < 0 {
			delete(running, e.i)
		} else {
			running[e.i] = true
		}
		if used <= size {
			peak = 0
			continue
		}
		if used <= peak {
			continue
		}
		var hs []Hold
		for i := range running {
			hs = append(hs, holds[i])
		}
		slices.SortFunc(hs, func(a, b Hold) int { return a.Start.Compare(b.Start) })
		v := Violation{Kind: "capacity", Holds: hs, At: e.at, Note: fmt.Sprintf("%d of %d permits in use", used, size)}
		if peak == 0 {
			vs = append(vs, v)
		} else {
			vs[len(vs)-1] = v
		}
		peak = used
	}
	return vs
}

// Overlaps reports whether the interval [start, end] overlaps a hold of
// an owner other than owner. holds must be sorted by Start; only the
// holds starting up to look back before end are examined, enough when
// holds of different owners do not overlap (at most one runs at a time).
func Overlaps(holds []Hold, owner string, start, end time.Time, lookBack int) bool {
	i, _ := slices.BinarySearchFunc(holds, end, func(h Hold, t time.Time) int { return h.Start.Compare(t) })
	for j := i - 1; j >= 0 && j >= i-lookBack; j-- {
		if h := holds[j]; h.Owner != owner && h.End.After(start) {
			return true
		}
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
