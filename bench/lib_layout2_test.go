package main

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

func TestLayout2Library(t *testing.T) {
	lib := layout2Library()
	var counts clientCounts
	var insts []instance
	for range 2 {
		inst, err := lib.open(redistest.Addr(t), &counts)
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, inst)
	}
	name := redistest.Name(t)
	var held sync.Mutex // locked by every holder: TryLock failing is a violation
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := insts[i%2].Mutex(name)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for range 20 {
				if err := m.Lock(ctx); err != nil {
					errs <- err
					return
				}
				if !held.TryLock() {
					errs <- errors.New("two holders at once")
				}
				held.Unlock()
				if err := m.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, inst := range insts {
		if err := inst.Close(); err != nil {
			t.Error(err)
		}
	}
	if counts.requests.Load() < 80 {
		t.Errorf("%d requests counted for 80 acquisitions", counts.requests.Load())
	}
}

// TestLayout2SitsOut: the layout-2 snapshot has only a Mutex on one
// server, so it runs the lock scenarios and sits out the others.
func TestLayout2SitsOut(t *testing.T) {
	jobs, err := plan(options{libs: "redisync-layout2", scenarios: "hot,uncontended,semaphore,rw,cluster", rounds: 1, settings: settings{base: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	for _, j := range jobs {
		ran = append(ran, j.scenario)
	}
	if len(ran) != 2 || ran[0] != "hot" || ran[1] != "uncontended" {
		t.Errorf("redisync-layout2 runs %v, want hot and uncontended only", ran)
	}
}
