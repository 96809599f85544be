package main

import (
	"math"
	"slices"
	"time"
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

// pool gathers the results of the same library in the same step of the
// same scenario, run in different rounds, into one: its figures (rates,
// per-acquisition and per-second figures, Jain) are the medians of the
// rounds' own, its counts add up, its distributions and contenders'
// counts merge (as if the rounds were one window: the CDF charts draw
// them), and the rounds' own results are kept in order (perRound), for
// the medians of quantiles and of ratios. Results keep the order of their
// first appearance.
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
	for i := range out {
		out[i].takeMedians()
	}
	return out
}

// medianFields are the figures of a result that pool sets to the medians
// of its rounds'.
var medianFields = []func(*result) *float64{
	func(r *result) *float64 { return &r.rate },
	func(r *result) *float64 { return &r.cmds },
	func(r *result) *float64 { return &r.calls },
	func(r *result) *float64 { return &r.requests },
	func(r *result) *float64 { return &r.cpu },
	func(r *result) *float64 { return &r.sys },
	func(r *result) *float64 { return &r.lua },
	func(r *result) *float64 { return &r.ccpu },
	func(r *result) *float64 { return &r.delivers },
	func(r *result) *float64 { return &r.subs },
	func(r *result) *float64 { return &r.background },
	func(r *result) *float64 { return &r.jain },
}

// takeMedians sets r's medianFields to the medians of its rounds'.
func (r *result) takeMedians() {
	for _, field := range medianFields {
		v := make([]float64, len(r.perRound))
		for k := range r.perRound {
			v[k] = *field(&r.perRound[k])
		}
		*field(r) = median(v)
	}
}

// merge returns a with b's counts added and b's samples merged, b being a
// run of the same library in the same shape in another round.
func merge(a, b result) result {
	m := a
	m.seconds += b.seconds
	m.acquisitions += b.acquisitions
	m.wait, m.op, m.gap, m.held = a.wait.merge(b.wait), a.op.merge(b.op), a.gap.merge(b.gap), a.held.merge(b.held)
	for i := range min(len(m.counts), len(b.counts)) {
		m.counts[i] += b.counts[i]
	}
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

// midRatio returns the median over the rounds of a's figure fa divided by
// b's figure fb in the same round: rounds are compared with themselves,
// so that a drift of the machine's load from one round to the next does
// not enter a ratio. NaN when no round has both.
func midRatio(a, b result, fa, fb func(result) float64) float64 {
	var v []float64
	for _, x := range a.perRound {
		for _, y := range b.perRound {
			if y.round == x.round && fa(x) >= 0 && fb(y) > 0 {
				v = append(v, fa(x)/fb(y))
			}
		}
	}
	return median(v)
}

// midQuantile returns the median over r's rounds of figure, a duration.
func midQuantile(r result, figure func(result) time.Duration) time.Duration {
	v := make([]float64, len(r.perRound))
	for k, x := range r.perRound {
		if v[k] = float64(figure(x)); v[k] < 0 {
			v[k] = math.NaN() // no samples
		}
	}
	if m := median(v); !math.IsNaN(m) {
		return time.Duration(m)
	}
	return -1
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
