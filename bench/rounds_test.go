package main

import (
	"math"
	"slices"
	"testing"
	"time"
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

func TestPoolMergesRoundsAsOneWindow(t *testing.T) {
	hot := shape{clients: 2, goroutines: 2, keys: 1}
	a := result{scenario: "hot", library: "x", shape: hot, seconds: 1, acquisitions: 100, rate: 100,
		cmds: 2, calls: 10, requests: 2, cpu: 50, ccpu: 100, wait: distOf(time.Millisecond, 3*time.Millisecond),
		counts: []int64{50, 50}, jain: 1, conns: 3, rounds: 1, errors: 1, firstError: "first"}
	other := result{scenario: "hot", library: "y", shape: hot, seconds: 1, acquisitions: 7, counts: []int64{7, 0}, rounds: 1}
	b := result{scenario: "hot", library: "x", shape: hot, seconds: 3, acquisitions: 300, rate: 100,
		cmds: 4, calls: 20, requests: 4, cpu: 10, ccpu: math.NaN(), wait: distOf(2 * time.Millisecond),
		counts: []int64{0, 300}, jain: 0.5, conns: 5, rounds: 1, errors: 2, firstError: "second"}

	got := pool([]result{a, other, b})
	if len(got) != 2 || got[0].library != "x" || got[1].library != "y" {
		t.Fatalf("pool kept %d results, want x then y", len(got))
	}
	m := got[0]
	if m.seconds != 4 || m.acquisitions != 400 || m.rate != 100 || m.rounds != 2 {
		t.Errorf("pooled %v s, %d acquisitions, %v/s, %d rounds; want 4, 400, 100, 2", m.seconds, m.acquisitions, m.rate, m.rounds)
	}
	if m.cmds != 3.5 || m.calls != 17.5 || m.cpu != 20 {
		t.Errorf("weighted figures cmds %v calls %v cpu %v; want 3.5, 17.5, 20", m.cmds, m.calls, m.cpu)
	}
	if !math.IsNaN(m.ccpu) {
		t.Errorf("ccpu %v, want NaN when a round could not tell", m.ccpu)
	}
	if m.wait.total != 3 || m.wait.max != 3*time.Millisecond || bucketOf(int64(m.wait.quantile(0.5))) != bucketOf(int64(2*time.Millisecond)) {
		t.Errorf("merged wait: %d samples, max %v, median %v", m.wait.total, m.wait.max, m.wait.quantile(0.5))
	}
	if !slices.Equal(m.counts, []int64{50, 350}) || m.jain != jain([]int64{50, 350}) {
		t.Errorf("counts %v jain %v", m.counts, m.jain)
	}
	if m.errors != 3 || m.firstError != "first" || m.conns != 5 {
		t.Errorf("errors %d %q conns %d", m.errors, m.firstError, m.conns)
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
	a := pool([]result{{library: "a", rate: 10}, {library: "b", rate: 20}, {library: "a", rate: 30}, {library: "b", rate: 30},
		{library: "a", rate: 18}, {library: "b", rate: 20}})
	rate := func(r result) float64 { return r.rate }
	if got := a[0].mid(rate); got != 18 {
		t.Errorf("median rate of a = %v, want 18", got)
	}
	if got := midRatio(a[0], a[1], rate, rate); got != 0.9 {
		t.Errorf("median ratio a/b = %v, want 0.9 (of 0.5, 1, 0.9)", got)
	}
	if got := midRatio(a[0], result{}, rate, rate); !math.IsNaN(got) {
		t.Errorf("ratio to a library that did not run = %v, want NaN", got)
	}
}
