package main

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// limitLibrary is the in-process limit: a sync.Mutex (or, for semaphores,
// a semaphore.Weighted; for read-write locks, a sync.RWMutex) per key, shared by every goroutine and instance
// of the run. It sends nothing to Redis.
func limitLibrary() library {
	reg := &limitRegistry{
		mutexes:    map[string]*sync.Mutex{},
		semaphores: map[string]*semaphore.Weighted{},
		rwmutexes:  map[string]*sync.RWMutex{},
	}
	return library{
		name:        "limit",
		about:       "in-process sync.Mutex (semaphore.Weighted for semaphores, sync.RWMutex for rw), shared by all goroutines",
		open:        func(string, *clientCounts) (instance, error) { return reg, nil },
		openCluster: func([]string, *clientCounts) (instance, error) { return reg, nil },
		semaphores:  true,
		rwmutexes:   true,
	}
}

// limitRegistry hands out the one in-process lock of each key. Every
// instance of the limit is the same registry, as if all clients were one
// process.
type limitRegistry struct {
	mu         sync.Mutex
	mutexes    map[string]*sync.Mutex
	semaphores map[string]*semaphore.Weighted
	rwmutexes  map[string]*sync.RWMutex
}

// Mutex returns the sync.Mutex of key.
func (r *limitRegistry) Mutex(key string) locker {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.mutexes[key]
	if m == nil {
		m = new(sync.Mutex)
		r.mutexes[key] = m
	}
	return syncLocker{m}
}

// Semaphore returns a holder of one permit of key's semaphore.Weighted.
func (r *limitRegistry) Semaphore(key string, size int64) locker {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.semaphores[key]
	if s == nil {
		s = semaphore.NewWeighted(size)
		r.semaphores[key] = s
	}
	return weightedLocker{s}
}

// Close forgets the locks of finished runs.
func (r *limitRegistry) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.mutexes)
	clear(r.semaphores)
	clear(r.rwmutexes)
	return nil
}

// syncLocker adapts a sync.Mutex. Lock cannot be cancelled; a run's
// holders stop holding once it ends, so its waiters drain quickly.
type syncLocker struct{ m *sync.Mutex }

// Lock locks the mutex.
func (l syncLocker) Lock(context.Context) error {
	l.m.Lock()
	return nil
}

// Unlock unlocks the mutex.
func (l syncLocker) Unlock(context.Context) error {
	l.m.Unlock()
	return nil
}

// weightedLocker adapts a semaphore.Weighted, one permit at a time.
type weightedLocker struct{ s *semaphore.Weighted }

// Lock acquires one permit.
func (l weightedLocker) Lock(ctx context.Context) error { return l.s.Acquire(ctx, 1) }

// Unlock releases one permit.
func (l weightedLocker) Unlock(context.Context) error {
	l.s.Release(1)
	return nil
}
