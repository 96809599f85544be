package fairness

import (
	"math"
	"testing"
)

func TestJain(t *testing.T) {
	tests := []struct {
		name string
		x    []int64
		want float64
	}{
		{"equal", []int64{5, 5, 5, 5}, 1},
		{"one gets all", []int64{8, 0, 0, 0}, 0.25},
		{"half", []int64{1, 1, 0, 0}, 0.5},
		{"uneven", []int64{1, 2, 3}, 36.0 / 42.0},
	}
	for _, tt := range tests {
		if got := Jain(tt.x); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("%s: Jain(%v) = %v, want %v", tt.name, tt.x, got, tt.want)
		}
	}
	if got := Jain([]int64{0, 0}); !math.IsNaN(got) {
		t.Errorf("Jain of zeros = %v, want NaN", got)
	}
	if got := Jain[int64](nil); !math.IsNaN(got) {
		t.Errorf("Jain(nil) = %v, want NaN", got)
	}
}
