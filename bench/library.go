package main

import (
	"context"
	"fmt"
	"strings"
)

// A locker is one owner of a lock, or one holder of a semaphore permit:
// what one goroutine (one thread of one process) uses. Lock blocks until
// it holds, or fails when ctx ends; Unlock gives back what Lock took.
type locker interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// An instance is one client of a library with its own connections,
// standing in for one process.
type instance interface {
	// Mutex returns a new owner of the lock called key.
	Mutex(key string) locker
	// Close releases the instance's connections and goroutines.
	Close() error
}

// A semaphoreInstance is an instance whose library has a counting
// semaphore.
type semaphoreInstance interface {
	instance
	// Semaphore returns a new holder of one permit of the semaphore called
	// key, which has size permits.
	Semaphore(key string, size int64) locker
}

// A library is one contender of the benchmark.
type library struct {
	name  string // as given to -libs and shown in the tables
	about string // its configuration, for the legend

	// open connects one instance to the Redis at addr, counting what it
	// sends in counts.
	open func(addr string, counts *clientCounts) (instance, error)

	// openCluster connects one instance to the Redis Cluster of the
	// primaries at addrs; nil when the library sits out the cluster
	// scenario.
	openCluster func(addrs []string, counts *clientCounts) (instance, error)

	// redisKey returns the Redis key of the lock called name (the one
	// whose hash slot decides which primary of a cluster serves the lock);
	// nil when the library keeps no lock in Redis.
	redisKey func(name string) string

	// semaphores says whether open returns a semaphoreInstance.
	semaphores bool
	// rwmutexes says whether open returns an rwInstance.
	rwmutexes bool
}

// connect opens one instance of l on t.
func (l library) connect(t *target, counts *clientCounts) (instance, error) {
	if t.cluster {
		return l.openCluster(t.addrs(), counts)
	}
	return l.open(t.nodes[0].addr, counts)
}

// libraries returns every contender, the in-process limit first.
func libraries() []library {
	return []library{
		limitLibrary(),
		redisyncLibrary(false),
		redisyncLibrary(true),
		layout2Library(),
		redsyncLibrary(),
		redislockLibrary("10ms"),
		redislockLibrary("1ms"),
		rueidislockLibrary(),
	}
}

// selectLibraries returns the libraries named in the comma-separated list
// (all of them for "all"), in their usual order.
func selectLibraries(list string) ([]library, error) {
	return selectByName(list, libraries(), func(l library) string { return l.name })
}

// selectByName picks from all the items named in the comma-separated list,
// keeping all's order; "all" picks everything.
func selectByName[T any](list string, all []T, name func(T) string) ([]T, error) {
	if list == "all" {
		return all, nil
	}
	wanted := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			wanted[n] = true
		}
	}
	var picked []T
	for _, item := range all {
		if wanted[name(item)] {
			picked = append(picked, item)
			delete(wanted, name(item))
		}
	}
	if len(wanted) > 0 || len(picked) == 0 {
		var known []string
		for _, item := range all {
			known = append(known, name(item))
		}
		return nil, fmt.Errorf("unknown or empty selection %q (choose from %s, or all)", list, strings.Join(known, ","))
	}
	return picked, nil
}
