package main

import (
	"math"
	"slices"
)

// rotate returns libs starting at the round's offset, so that over the
// rounds every library runs in every place of a step: on a shared machine
// the load drifts, and a fixed order would give one library the same
// moment of each step every time.
func rotate(libs []library, round int) []library {
	if len(libs) == 0 {
		return libs
	}
	k := round % len(libs)
	return append(slices.Clone(libs[k:]), libs[:k]...)
}

// pool merges the results of the same library in the same step of the
// same scenario, run in different rounds, as if they were one window:
// counts and times add up, per-acquisition figures are weighted by
// acquisitions and per-second ones by seconds, distributions and the
// contenders' counts are merged (so Jain is over the pooled counts). The
// rounds' own results are kept in order (perRound), for their medians.
// Results keep the order of their first appearance.
func pool(results []result) []result {
	type key struct {
		scenario, library string
		goroutines        int
	}
	var out []result
	index := map[key]int{}
	for _, r := range results {
		k := key{r.scenario, r.library, r.goroutines}
		i, ok := index[k]
		if !ok {
			index[k] = len(out)
			r.counts = slices.Clone(r.counts)
			r.perRound = []result{r}
			out = append(out, r)
			continue
		}
		out[i] = merge(out[i], r)
		out[i].perRound = append(out[i].perRound, r)
	}
	return out
}

// merge returns the pooled result of a and b, two runs of one library in
// one shape.
func merge(a, b result) result {
	n := a.acquisitions + b.acquisitions
	weighted := func(x, y float64) float64 {
		switch {
		case a.acquisitions == 0:
			return y
		case b.acquisitions == 0:
			return x
		}
		return (x*float64(a.acquisitions) + y*float64(b.acquisitions)) / float64(n)
	}
	m := a
	m.seconds += b.seconds
	m.acquisitions = n
	m.rate = float64(n) / m.seconds
	m.cmds, m.calls = weighted(a.cmds, b.cmds), weighted(a.calls, b.calls)
	m.requests = weighted(a.requests, b.requests)
	m.cpu, m.ccpu = weighted(a.cpu, b.cpu), weighted(a.ccpu, b.ccpu)
	m.delivers, m.subs = weighted(a.delivers, b.delivers), weighted(a.subs, b.subs)
	m.background = (a.background*a.seconds + b.background*b.seconds) / m.seconds
	m.wait, m.op, m.gap = a.wait.merge(b.wait), a.op.merge(b.op), a.gap.merge(b.gap)
	for i := range min(len(m.counts), len(b.counts)) {
		m.counts[i] += b.counts[i]
	}
	m.jain = jain(m.counts)
	m.violations += b.violations
	m.errors += b.errors
	if m.firstError == "" {
		m.firstError = b.firstError
	}
	m.conns = max(a.conns, b.conns)
	m.left += b.left
	m.persistent = append(slices.Clip(a.persistent), b.persistent...)
	m.rounds = a.rounds + b.rounds
	return m
}

// merge returns the distribution of the samples of d and e together.
func (d distribution) merge(e distribution) distribution {
	out := distribution{total: d.total + e.total, max: max(d.max, e.max)}
	i, j := 0, 0
	for i < len(d.buckets) || j < len(e.buckets) {
		switch {
		case j == len(e.buckets) || (i < len(d.buckets) && d.buckets[i].index < e.buckets[j].index):
			out.buckets = append(out.buckets, d.buckets[i])
			i++
		case i == len(d.buckets) || e.buckets[j].index < d.buckets[i].index:
			out.buckets = append(out.buckets, e.buckets[j])
			j++
		default:
			out.buckets = append(out.buckets, bucketCount{index: d.buckets[i].index, n: d.buckets[i].n + e.buckets[j].n})
			i, j = i+1, j+1
		}
	}
	return out
}

// mid returns the median over r's rounds of figure, the rounds where it is
// NaN left out (NaN when all are); figure of r itself when r was not
// pooled.
func (r result) mid(figure func(result) float64) float64 {
	if len(r.perRound) == 0 {
		return figure(r)
	}
	var v []float64
	for _, x := range r.perRound {
		v = append(v, figure(x))
	}
	return median(v)
}

// midRatio returns the median over the rounds of a's figure fa divided by
// b's figure fb in the same round: rounds are compared with themselves,
// so that a drift of the machine's load from one round to the next does
// not enter a ratio. NaN when no round has both.
func midRatio(a, b result, fa, fb func(result) float64) float64 {
	ar, br := a.perRound, b.perRound
	if len(ar) == 0 {
		ar, br = []result{a}, []result{b}
	}
	var v []float64
	for i := range min(len(ar), len(br)) {
		if x, y := fa(ar[i]), fb(br[i]); x >= 0 && y > 0 {
			v = append(v, x/y)
		}
	}
	return median(v)
}

// median returns the median of v, NaN values left out; NaN when none is
// left.
func median(v []float64) float64 {
	v = slices.DeleteFunc(slices.Clone(v), math.IsNaN)
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}
