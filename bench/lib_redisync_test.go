package main

import (
	"slices"
	"testing"
	"time"
)

// semaphoreRunners returns the libraries the plan runs in the semaphore
// scenario.
func semaphoreRunners(t *testing.T) []string {
	t.Helper()
	jobs, err := plan(options{libs: "all", scenarios: "semaphore", rounds: 1, settings: settings{base: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range jobs {
		names = append(names, j.lib.name)
	}
	return names
}

func TestSemaphoreHook(t *testing.T) {
	if got := semaphoreRunners(t); !slices.Equal(got, []string{"limit", "redisync"}) {
		t.Errorf("semaphore scenario runs %v with the hook, want limit and redisync", got)
	}

	hook := redisyncSemaphore
	redisyncSemaphore = nil
	defer func() { redisyncSemaphore = hook }()
	if got := semaphoreRunners(t); !slices.Equal(got, []string{"limit"}) {
		t.Errorf("semaphore scenario runs %v without the hook, want only the limit", got)
	}
	var _ semaphoreInstance = &redisyncInstance{}
	var _ locker = semaphoreLocker{}
}
