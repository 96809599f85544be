package main

import (
	"testing"
	"time"
)

func TestWarmupCoversTheFirstTurn(t *testing.T) {
	set := settings{base: 8 * time.Second}
	for _, sc := range scenarios() {
		for _, s := range sc.shapes(set) {
			perKey := s.goroutines / s.keys / int(max(s.size, 1))
			if turn := time.Duration(perKey) * s.hold; s.warmup < turn {
				t.Errorf("%s %s: warm-up %v is shorter than one turn of the lock, %v", sc.name, s.label(), s.warmup, turn)
			}
			if s.warmup < set.base/16 {
				t.Errorf("%s %s: warm-up %v is shorter than base/16", sc.name, s.label(), s.warmup)
			}
		}
	}
}
