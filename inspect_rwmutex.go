package redisync

import (
	"cmp"
	"context"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// RWMutexState is the state of a read-write lock as InspectRWMutex read
// it, at one instant.
type RWMutexState struct {
	Name       string
	ServerTime time.Time // the Redis server's clock at the instant read
	// Writer is the write held, nil when none is.
	Writer *RWMutexHolder
	// Readers is the reads held, ordered by ID: all of them, or, when the
	// lock has more holders than InspectPage, those of the InspectPage
	// whose leases end first.
	Readers []RWMutexHolder
	// ReadersLen counts the reads held, all of them.
	ReadersLen int
	// Queue is the waiters, readers and writers, the next to be served
	// first: the first InspectPage of them.
	Queue []RWMutexWaiter
	// QueueLen counts the waiters, all of them.
	QueueLen int
	// Subscribers counts the processes subscribed to their grant channels
	// of the lock, as for a lock (LockState.Subscribers): those of the
	// Clients of the waiters in Queue.
	Subscribers int64
}

// Held reports whether a write or a read is held under a lease that has
// not ended.
func (s *RWMutexState) Held() bool {
	if s.Writer != nil && s.Writer.Lease > 0 {
		return true
	}
	for _, r := range s.Readers {
		if r.Lease > 0 {
			return true
		}
	}
	return false
}

// Empty reports whether nothing of the lock is stored: no holder, no
// waiter.
func (s *RWMutexState) Empty() bool {
	return s.Writer == nil && s.ReadersLen == 0 && s.QueueLen == 0 && len(s.Readers) == 0 && len(s.Queue) == 0
}

// RWMutexHolder is one hold of a read-write lock: one Lock or RLock that
// holds.
type RWMutexHolder struct {
	ID    string // the hold id: label "/" client id "-" number
	Label string // who holds, for people (see WithLabel)
	// Lease is the time left before the hold ends unless its holder renews
	// it; 0 or less: ended, reclaimed by the lock's next call.
	Lease time.Duration
}

// RWMutexWaiter is a queued reader or writer: one blocked RLock or Lock.
type RWMutexWaiter struct {
	ID     string // the waiter id: the holder id, "#", the call's number, "." and a random part
	Holder string // the holder id of the RWMutex value that waits
	Label  string // whose call, for people (see WithLabel)
	Write  bool   // whether it waits to write (Lock); false: to read (RLock)
	Waited time.Duration
	// Heartbeat, GrantLease and Alive are as for a lock's waiter
	// (LockWaiter's Heartbeat, HandoffLease and Alive).
	Heartbeat  time.Duration
	GrantLease time.Duration
	Alive      bool
}

// InspectRWMutex reads the state of the read-write lock called name: its
// writer or its readers with their leases, and its queue in order, each
// waiter marked read or write, the first InspectPage of each with their
// counts. It reads as InspectLock does. Only WithKeyPrefix applies to it,
// naming the keys as for NewRWMutex; any other option is ErrInvalidOption.
// A lock never used, or idle for an hour, is Empty.
func (c *Client) InspectRWMutex(ctx context.Context, name string, opts ...Option) (*RWMutexState, error) {
	cfg := with(c.cfg, atInspect, opts)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect rwmutex", name, err)
	}
	s, err := c.inspectSemaphore(ctx, name, schema.RWMutexKeys(cfg.prefix, name))
	if err != nil {
		return nil, wrapOp("inspect rwmutex", name, err)
	}
	return rwMutexState(s), nil
}

// rwMutexState describes the semaphore under a RWMutex, s, as the lock it
// is: a holder or waiter of rwMutexWrite permits is a write, one of 1 a
// read.
func rwMutexState(s *SemaphoreState) *RWMutexState {
	st := &RWMutexState{Name: s.Name, ServerTime: s.ServerTime, ReadersLen: s.HoldersLen, Readers: []RWMutexHolder{},
		Queue: []RWMutexWaiter{}, QueueLen: s.QueueLen, Subscribers: s.Subscribers}
	for _, h := range s.Holders {
		rh := RWMutexHolder{ID: h.ID, Label: h.Label, Lease: h.Lease}
		if h.Permits >= rwMutexWrite {
			st.Writer = &rh
			st.ReadersLen--
		} else {
			st.Readers = append(st.Readers, rh)
		}
	}
	for _, w := range s.Queue {
		st.Queue = append(st.Queue, RWMutexWaiter{ID: w.ID, Holder: w.Holder, Label: w.Label, Write: w.Permits >= rwMutexWrite,
			Waited: w.Waited, Heartbeat: w.Heartbeat, GrantLease: w.GrantLease, Alive: w.Alive})
	}
	return st
}
