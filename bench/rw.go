package main

import (
	"context"
	"math/rand/v2"
	"sync"

	"github.com/redisync/redisync"
)

// rwWrites is the share of a rw scenario's acquisitions that write, in
// tenths; the rest read.
const rwWrites = 1

// writeWeight is what a writer adds to a lock's inside count in a rw
// scenario, a reader 1: a writer must find the count at 0, a reader
// below writeWeight.
const writeWeight = 1 << 30

// An rwInstance is an instance whose library has a read-write lock.
type rwInstance interface {
	instance
	// RWMutex returns a new owner of the read-write lock called key, as
	// the locker of its reads and the locker of its writes.
	RWMutex(key string) (read, write locker)
}

// writer marks the locker of a read-write lock's writes.
type writer interface{ writes() }

// rwPicker returns a contender's picker in a rw scenario: the owner's
// write locker for one acquisition in ten, its read locker otherwise.
func rwPicker(read, write locker, st *lockState) func() (locker, *lockState) {
	return func() (locker, *lockState) {
		if rand.IntN(10) < rwWrites {
			return write, st
		}
		return read, st
	}
}

// enter counts l into st and reports whether that broke the lock's rule:
// in a rw scenario, a writer alone or readers only; else at most allowed
// inside. It returns what leave takes away.
func (r *run) enter(l locker, st *lockState) (weight int64, violated bool) {
	if !r.rw {
		return 1, st.inside.Add(1) > r.allowed
	}
	if _, ok := l.(writer); ok {
		return writeWeight, st.inside.Add(writeWeight) != writeWeight
	}
	return 1, st.inside.Add(1) >= writeWeight
}

// rwLimit adapts a sync.RWMutex: its reads (write false) or its writes.
type rwLimit struct {
	m     *sync.RWMutex
	write bool
}

// Lock takes a read or the write.
func (l rwLimit) Lock(context.Context) error {
	if l.write {
		l.m.Lock()
	} else {
		l.m.RLock()
	}
	return nil
}

// Unlock gives it back.
func (l rwLimit) Unlock(context.Context) error {
	if l.write {
		l.m.Unlock()
	} else {
		l.m.RUnlock()
	}
	return nil
}

// rwLimitWriter is the locker of a sync.RWMutex's writes.
type rwLimitWriter struct{ rwLimit }

func (rwLimitWriter) writes() {}

// RWMutex returns lockers of the one sync.RWMutex of key.
func (r *limitRegistry) RWMutex(key string) (read, write locker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.rwmutexes[key]
	if m == nil {
		m = new(sync.RWMutex)
		r.rwmutexes[key] = m
	}
	return rwLimit{m, false}, rwLimitWriter{rwLimit{m, true}}
}

// redisyncRead adapts a redisync RWMutex's reads.
type redisyncRead struct{ m *redisync.RWMutex }

// Lock takes a read.
func (l redisyncRead) Lock(ctx context.Context) error { return l.m.RLock(ctx) }

// Unlock gives it back.
func (l redisyncRead) Unlock(ctx context.Context) error { return l.m.RUnlock(ctx) }

// redisyncWrite adapts a redisync RWMutex's writes.
type redisyncWrite struct{ m *redisync.RWMutex }

// Lock takes the write.
func (l redisyncWrite) Lock(ctx context.Context) error { return l.m.Lock(ctx) }

// Unlock gives it back.
func (l redisyncWrite) Unlock(ctx context.Context) error { return l.m.Unlock(ctx) }

func (redisyncWrite) writes() {}

// RWMutex returns lockers of a new redisync RWMutex value: one owner.
func (r *redisyncInstance) RWMutex(key string) (read, write locker) {
	m := made(r.c.NewRWMutex(key))
	return redisyncRead{m}, redisyncWrite{m}
}
