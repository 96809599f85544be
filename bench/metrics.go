package main

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram geometry: values below 2^subBits ns are exact; above, every
// power of two is split into 2^subBits buckets, so a bucket is at most
// 1/64 (1.6%) of its value wide. Values of 2^maxBits ns (18 minutes) and
// more land in the last bucket.
const (
	subBits  = 6
	subCount = 1 << subBits
	maxBits  = 40
	nBuckets = (maxBits - subBits + 1) * subCount
)

// histogram counts durations in log-linear buckets. Its methods are safe
// for concurrent use: every goroutine of a run records into the same one.
type histogram struct {
	counts [nBuckets]atomic.Int64
	max    atomic.Int64
}

// bucketOf returns the bucket index of a duration of v ns (v >= 0).
func bucketOf(v int64) int {
	if v < subCount {
		return int(max(v, 0))
	}
	shift := bits.Len64(uint64(v)) - subBits - 1
	i := (shift+1)*subCount + int(v>>shift) - subCount
	return min(i, nBuckets-1)
}

// bucketRange returns the smallest value of bucket i and its width, in ns.
func bucketRange(i int) (low, width int64) {
	if i < subCount {
		return int64(i), 1
	}
	shift := i/subCount - 1
	return int64(i%subCount+subCount) << shift, 1 << shift
}

// record adds one duration.
func (h *histogram) record(d time.Duration) {
	v := int64(d)
	h.counts[bucketOf(v)].Add(1)
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			return
		}
	}
}

// snapshot returns the histogram's counts as a distribution.
func (h *histogram) snapshot() distribution {
	d := distribution{max: time.Duration(h.max.Load())}
	for i := range h.counts {
		if n := h.counts[i].Load(); n > 0 {
			d.buckets = append(d.buckets, bucketCount{index: i, n: n})
			d.total += n
		}
	}
	return d
}

// A bucketCount is one non-empty histogram bucket.
type bucketCount struct {
	index int
	n     int64
}

// A distribution is a frozen histogram: the non-empty buckets in order.
type distribution struct {
	buckets []bucketCount
	total   int64
	max     time.Duration
}

// quantile returns the value below which a fraction q (0..1) of the
// samples lie: the middle of the bucket holding the sample of rank
// ceil(q*total), capped at the largest sample. It returns -1 for an empty
// distribution.
func (d distribution) quantile(q float64) time.Duration {
	if d.total == 0 {
		return -1
	}
	rank := max(int64(math.Ceil(q*float64(d.total))), 1)
	var seen int64
	for _, b := range d.buckets {
		if seen += b.n; seen >= rank {
			low, width := bucketRange(b.index)
			return min(time.Duration(low+width/2), d.max)
		}
	}
	return d.max
}

// A cdfPoint says that a fraction of the samples is at most value.
type cdfPoint struct {
	value    time.Duration
	fraction float64
}

// cdf returns the cumulative distribution at the upper edge of every
// non-empty bucket.
func (d distribution) cdf() []cdfPoint {
	points := make([]cdfPoint, 0, len(d.buckets))
	var seen int64
	for _, b := range d.buckets {
		seen += b.n
		low, width := bucketRange(b.index)
		points = append(points, cdfPoint{
			value:    min(time.Duration(low+width), max(d.max, 1)),
			fraction: float64(seen) / float64(d.total),
		})
	}
	return points
}

// perAcquisition divides a counter's growth by the acquisitions made
// meanwhile; NaN when either is unknown or there were no acquisitions.
func perAcquisition(delta float64, acquisitions int64) float64 {
	if acquisitions == 0 || math.IsNaN(delta) {
		return math.NaN()
	}
	return delta / float64(acquisitions)
}
