package main

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/fairness"
)

func TestRotate(t *testing.T) {
	libs := []library{{name: "a"}, {name: "b"}, {name: "c"}}
	names := func(l []library) (n []string) {
		for _, x := range l {
			n = append(n, x.name)
		}
		return n
	}
	for round, want := range [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}, {"a", "b", "c"}} {
		if got := names(rotate(libs, round)); !slices.Equal(got, want) {
			t.Errorf("rotate(round %d) = %v, want %v", round, got, want)
		}
	}
	if got := names(libs); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("rotate changed its input: %v", got)
	}
}

func distOf(values ...time.Duration) distribution {
	var h histogram
	for _, v := range values {
		h.record(v)
	}
	return h.snapshot()
}

func TestPoolTakesMediansAndMergesSamples(t *testing.T) {
	hot := shape{clients: 2, goroutines: 2, keys: 1}
	run := func(round int, rate, cmds, ccpu float64, errors int64, first string, wait distribution, counts []int64) result {
		return result{scenario: "hot", library: "x", shape: hot, round: round, seconds: 1, acquisitions: int64(rate),
			rate: rate, cmds: cmds, ccpu: ccpu, wait: wait, counts: counts, jain: fairness.Jain(counts), conns: int(errors) + 2,
			rounds: 1, errors: errors, firstError: first, left: 2}
	}
	a := run(0, 100, 2, 10, 1, "first", distOf(time.Millisecond, 3*time.Millisecond), []int64{50, 50})
	b := run(1, 300, 4, math.NaN(), 0, "", distOf(2*time.Millisecond), []int64{0, 300})
	c := run(2, 200, 9, 30, 2, "third", distOf(4*time.Millisecond), []int64{100, 100})
	other := result{scenario: "hot", library: "y", shape: hot, seconds: 1, acquisitions: 7, counts: []int64{7, 0}, rounds: 1}

	got := pool([]result{a, other, b, c})
	if len(got) != 2 || got[0].library != "x" || got[1].library != "y" {
		t.Fatalf("pool kept %d results, want x then y", len(got))
	}
	m := got[0]
	if m.seconds != 3 || m.acquisitions != 600 || m.rounds != 3 || len(m.perRound) != 3 {
		t.Errorf("pooled %v s, %d acquisitions, %d rounds, %d kept; want 3, 600, 3, 3", m.seconds, m.acquisitions, m.rounds, len(m.perRound))
	}
	if m.rate != 200 || m.cmds != 4 || m.ccpu != 20 || m.jain != 1 {
		t.Errorf("medians rate %v cmds %v ccpu %v jain %v; want 200, 4, 20 (a NaN round left out), 1", m.rate, m.cmds, m.ccpu, m.jain)
	}
	if m.wait.total != 4 || m.wait.max != 4*time.Millisecond {
		t.Errorf("merged wait: %d samples, max %v; want 4, 4ms", m.wait.total, m.wait.max)
	}
	if got := midQuantile(m, func(r result) time.Duration { return r.wait.max }); got != 3*time.Millisecond {
		t.Errorf("median of the rounds' max wait %v, want 3ms", got)
	}
	if !slices.Equal(m.counts, []int64{150, 450}) {
		t.Errorf("counts %v, want [150 450]", m.counts)
	}
	if m.errors != 3 || m.firstError != "first" || m.conns != 4 || m.left != 6 {
		t.Errorf("errors %d %q conns %d left %d; want 3, first, 4, 6", m.errors, m.firstError, m.conns, m.left)
	}
	if !slices.Equal(a.counts, []int64{50, 50}) {
		t.Errorf("pool changed its input's counts: %v", a.counts)
	}
}

func TestDistributionMergeKeepsBucketsOrdered(t *testing.T) {
	d := distOf(1, 100, 10000)
	e := distOf(50, 100, 1e6)
	m := d.merge(e)
	if m.total != 6 {
		t.Fatalf("total %d, want 6", m.total)
	}
	var seen int64
	for i, b := range m.buckets {
		if i > 0 && b.index <= m.buckets[i-1].index {
			t.Fatalf("buckets out of order: %v", m.buckets)
		}
		seen += b.n
	}
	if seen != 6 || m.max != 1e6 {
		t.Errorf("merged %d samples, max %v", seen, m.max)
	}
}

func TestMedianOfRounds(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		v    []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{nan, 5, 1}, 3},
		{[]float64{7}, 7},
	} {
		if got := median(tc.v); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.v, got, tc.want)
		}
	}
	if got := median([]float64{nan}); !math.IsNaN(got) {
		t.Errorf("median of NaN only = %v, want NaN", got)
	}

	// Two libraries over three rounds: a ratio is the median of the
	// rounds' ratios, not the ratio of the medians.
	a := pool([]result{{library: "a", rate: 10}, {library: "b", rate: 20}, {library: "a", rate: 30, round: 1}, {library: "b", rate: 30, round: 1},
		{library: "a", rate: 18, round: 2}, {library: "b", rate: 20, round: 2}})
	if a[0].rate != 18 {
		t.Errorf("median rate of a = %v, want 18", a[0].rate)
	}
	if got := midRatio(a[0], a[1], rateOf, rateOf); got != 0.9 {
		t.Errorf("median ratio a/b = %v, want 0.9 (of 0.5, 1, 0.9)", got)
	}
	if got := midRatio(a[0], result{}, rateOf, rateOf); !math.IsNaN(got) {
		t.Errorf("ratio to a library that did not run = %v, want NaN", got)
	}
}
