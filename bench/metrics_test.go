package main

import (
	"math"
	"testing"
	"time"
)

func TestBucketsCoverEveryValue(t *testing.T) {
	prevEnd := int64(0)
	for i := range nBuckets {
		low, width := bucketRange(i)
		if low != prevEnd {
			t.Fatalf("bucket %d starts at %d, the previous ended at %d", i, low, prevEnd)
		}
		if bucketOf(low) != i || bucketOf(low+width-1) != i {
			t.Fatalf("bucket %d [%d, %d) does not map back to itself", i, low, low+width)
		}
		if i >= subCount && float64(width)/float64(low) > 1.0/subCount+1e-12 {
			t.Fatalf("bucket %d is %d wide at %d: coarser than 1/%d", i, width, low, subCount)
		}
		prevEnd = low + width
	}
	if got := bucketOf(math.MaxInt64); got != nBuckets-1 {
		t.Errorf("bucketOf(MaxInt64) = %d, want the last bucket", got)
	}
	if got := bucketOf(-5); got != 0 {
		t.Errorf("bucketOf(-5) = %d, want 0", got)
	}
}

func TestQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	d := h.snapshot()
	if d.total != 1000 || d.max != time.Millisecond {
		t.Fatalf("total %d, max %v; want 1000, 1ms", d.total, d.max)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 500 * time.Microsecond},
		{0.99, 990 * time.Microsecond},
		{0.001, time.Microsecond},
		{1, time.Millisecond},
	} {
		got := d.quantile(c.q)
		if rel := math.Abs(float64(got-c.want)) / float64(c.want); rel > 1.0/subCount {
			t.Errorf("quantile(%v) = %v, want %v within 1/%d", c.q, got, c.want, subCount)
		}
	}
	if got := (distribution{}).quantile(0.5); got != -1 {
		t.Errorf("quantile of nothing = %v, want -1", got)
	}
}

func TestQuantileExactForSmallValues(t *testing.T) {
	var h histogram
	for _, v := range []time.Duration{3, 7, 7, 9} {
		h.record(v)
	}
	d := h.snapshot()
	if got := d.quantile(0.5); got != 7 {
		t.Errorf("median = %v, want 7ns", got)
	}
	if got := d.quantile(0.25); got != 3 {
		t.Errorf("p25 = %v, want 3ns", got)
	}
}

func TestCDF(t *testing.T) {
	var h histogram
	for i := range 100 {
		h.record(time.Duration(i+1) * time.Millisecond)
	}
	points := h.snapshot().cdf()
	last := cdfPoint{}
	for _, p := range points {
		if p.value <= last.value || p.fraction <= last.fraction {
			t.Fatalf("cdf not increasing at %+v after %+v", p, last)
		}
		last = p
	}
	if last.fraction != 1 || last.value != 100*time.Millisecond {
		t.Errorf("cdf ends at %+v, want 100%% at 100ms", last)
	}
}

func TestPerAcquisition(t *testing.T) {
	if got := perAcquisition(30, 10); got != 3 {
		t.Errorf("perAcquisition(30, 10) = %v", got)
	}
	if got := perAcquisition(30, 0); !math.IsNaN(got) {
		t.Errorf("perAcquisition(30, 0) = %v, want NaN", got)
	}
}

func TestFmtDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-1:                          "-",
		850:                         "850ns",
		1500:                        "1.50µs",
		37 * time.Millisecond:       "37.0ms",
		697 * time.Millisecond:      "697ms",
		2900 * time.Millisecond:     "2.90s",
		999999 * time.Nanosecond:    "1000µs",
		12345678 * time.Microsecond: "12.3s",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%d) = %q, want %q", int64(d), got, want)
		}
	}
}
