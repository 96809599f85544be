package main

import (
	"io"
	"testing"
	"time"
)

func TestDemoMultiChecks(t *testing.T) {
	p := &multiPart{acq: [][]int64{{3, 0}}}
	p.violations.Store(1)
	p.balance[0].Store(demoBalance - 5) // money lost
	for i := 1; i < demoAccounts; i++ {
		p.balance[i].Store(demoBalance)
	}
	failed := 0
	for _, c := range p.summary(io.Discard, time.Second, &Status{}) {
		if !c.ok {
			failed++
		}
	}
	// two transfers of an account at once, money lost, an idle worker
	if failed != 3 {
		t.Errorf("%d checks failed, want 3", failed)
	}
}
