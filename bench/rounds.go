package main

import "slices"

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
// contenders' counts are merged (so Jain is over the pooled counts).
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
			out = append(out, r)
			continue
		}
		out[i] = merge(out[i], r)
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
