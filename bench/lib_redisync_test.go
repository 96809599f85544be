package main

import (
	"slices"
	"testing"
	"time"

	"github.com/redisync/redisync"
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
	if redisyncSemaphore != nil {
		t.Skip("redisync has a semaphore now: the hook is set")
	}
	if got := semaphoreRunners(t); !slices.Equal(got, []string{"limit"}) {
		t.Errorf("semaphore scenario runs %v without the hook, want only the limit", got)
	}

	redisyncSemaphore = func(*redisync.Client, string, int64) locker { return nil }
	defer func() { redisyncSemaphore = nil }()
	if got := semaphoreRunners(t); !slices.Equal(got, []string{"limit", "redisync"}) {
		t.Errorf("semaphore scenario runs %v with the hook, want limit and redisync", got)
	}
	var _ semaphoreInstance = &redisyncInstance{}
}
