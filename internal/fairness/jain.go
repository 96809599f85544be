// Package fairness measures how evenly contenders were served: the one
// definition that the demo, the benchmark and the tests report.
package fairness

import "math"

// Jain returns Jain's fairness index of the shares x: (Σx)² / (n·Σx²),
// 1 when all are equal, 1/n when one got everything. It returns NaN when
// there are no shares or all are zero.
func Jain[T ~int | ~int64](x []T) float64 {
	var sum, squares float64
	for _, v := range x {
		sum += float64(v)
		squares += float64(v) * float64(v)
	}
	if squares == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(x)) * squares)
}
