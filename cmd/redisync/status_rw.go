// The read-write lock part of "redisync status".

package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/redisync/redisync"
)

// RWStatus is the state of a read-write lock (redisync.RWMutex): its
// writer or its readers, and its queue.
type RWStatus struct {
	Writer  *RWHolder  `json:"writer"` // null when nobody writes
	Readers []RWHolder `json:"readers"`
	// ReadersLen counts the reads held, of which Readers lists those of
	// the first redisync.InspectPage holders (RWMutexState.ReadersLen).
	ReadersLen int        `json:"readers_len"`
	Queue      []RWWaiter `json:"queue"`
	// QueueLen counts the waiters, of which Queue lists the first
	// redisync.InspectPage (RWMutexState.QueueLen).
	QueueLen int `json:"queue_len"`
}

// RWHolder is a hold of a read-write lock: its writer or one reader.
type RWHolder struct {
	Owner   string `json:"owner"`
	Label   string `json:"label"`
	LeaseMS int64  `json:"lease_ms"`
}

// RWWaiter is a queued reader or writer: one blocked RLock or Lock of the
// owner Owner.
type RWWaiter struct {
	Position    int    `json:"position"`
	Waiter      string `json:"waiter"` // "owner#call"
	Owner       string `json:"owner"`
	Label       string `json:"label"`
	Write       bool   `json:"write"`
	WaitedMS    int64  `json:"waited_ms"` // since it joined the queue
	HeartbeatMS int64  `json:"heartbeat_ms"`
	Alive       bool   `json:"alive"`
}

// rwStatus converts what InspectRWMutex read.
func rwStatus(s *redisync.RWMutexState) *RWStatus {
	st := &RWStatus{Readers: []RWHolder{}, ReadersLen: s.ReadersLen, Queue: []RWWaiter{}, QueueLen: s.QueueLen}
	if w := s.Writer; w != nil {
		st.Writer = &RWHolder{Owner: w.ID, Label: w.Label, LeaseMS: w.Lease.Milliseconds()}
	}
	for _, r := range s.Readers {
		st.Readers = append(st.Readers, RWHolder{Owner: r.ID, Label: r.Label, LeaseMS: r.Lease.Milliseconds()})
	}
	for i, w := range s.Queue {
		st.Queue = append(st.Queue, RWWaiter{Position: i + 1, Waiter: w.ID, Owner: w.Holder, Label: w.Label,
			Write: w.Write, WaitedMS: w.Waited.Milliseconds(),
			HeartbeatMS: w.Heartbeat.Milliseconds(), Alive: w.Alive})
	}
	return st
}

// held reports whether a read or the write is held by a holder whose
// lease has not ended.
func (s *RWStatus) held() bool {
	if s.Writer != nil && s.Writer.LeaseMS > 0 {
		return true
	}
	for _, r := range s.Readers {
		if r.LeaseMS > 0 {
			return true
		}
	}
	return false
}

// printRW writes the read-write lock part of st for people.
func printRW(out io.Writer, st *Status) {
	s := st.RWMutex
	fmt.Fprintf(out, "rwmutex %q\n", st.Name)
	lease := func(h RWHolder) string {
		if h.LeaseMS <= 0 {
			return "ended (reclaimed on the next call)"
		}
		return ms(h.LeaseMS) + " left"
	}
	switch {
	case s.Writer != nil:
		field(out, "writer", s.Writer.Owner+", lease "+lease(*s.Writer))
	case len(s.Readers) == 0:
		field(out, "holders", "none (free)")
	default:
		field(out, "readers", strconv.Itoa(max(s.ReadersLen, len(s.Readers))))
		rows := [][]string{{"owner", "lease"}}
		for _, r := range s.Readers {
			rows = append(rows, []string{r.Owner, lease(r)})
		}
		table(out, rows)
	}
	if len(s.Queue) == 0 && s.QueueLen == 0 {
		field(out, "queue", "empty")
		return
	}
	field(out, "queue", queueText(s.QueueLen, len(s.Queue)))
	rows := [][]string{{"#", "waiter", "wants", "heartbeat due"}}
	for _, q := range s.Queue {
		wants := "read"
		if q.Write {
			wants = "write"
		}
		rows = append(rows, []string{strconv.Itoa(q.Position), q.Waiter, wants, heartbeatText(Waiter{HeartbeatMS: q.HeartbeatMS, Alive: q.Alive})})
	}
	table(out, rows)
}
