package main

import (
	"context"
	"fmt"
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

// namedLocker is a locker that only knows its lock's name.
type namedLocker struct{ name string }

func (namedLocker) Lock(context.Context) error   { return nil }
func (namedLocker) Unlock(context.Context) error { return nil }

// namingInstance makes namedLockers.
type namingInstance struct{}

func (namingInstance) Mutex(key string) locker { return namedLocker{key} }
func (namingInstance) Close() error            { return nil }

func TestPerEntityPicksAnyLockWithItsState(t *testing.T) {
	s := shape{clients: 2, goroutines: 4, keys: 50, perEntity: true}
	r := &run{shape: s, locks: make([]lockState, s.keys)}
	names := make([]string, s.keys)
	for k := range names {
		names[k] = fmt.Sprint("lock", k)
	}
	pickers, err := r.pickers([]instance{namingInstance{}, namingInstance{}}, names)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 2000 {
		l, st := pickers[3]()
		k := 0
		for k < len(r.locks) && &r.locks[k] != st {
			k++
		}
		if name := l.(namedLocker).name; k == len(r.locks) || name != names[k] {
			t.Fatalf("picked %s with the state of lock %d", name, k)
		}
		seen[l.(namedLocker).name] = true
	}
	if len(seen) != s.keys {
		t.Errorf("2000 picks took %d of the %d locks", len(seen), s.keys)
	}
}
