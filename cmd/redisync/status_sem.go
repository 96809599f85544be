// The semaphore part of "redisync status".

package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/redisync/redisync"
)

// SemStatus is the state of a semaphore.
type SemStatus struct {
	Size      int64       `json:"size"`
	Available int64       `json:"available"`
	Holders   []SemHolder `json:"holders"`
	Queue     []SemWaiter `json:"queue"`
	// HoldersLen and QueueLen count the holders and the waiters, of which
	// Holders and Queue list the first redisync.InspectPage
	// (SemaphoreState.HoldersLen and QueueLen).
	HoldersLen int `json:"holders_len"`
	QueueLen   int `json:"queue_len"`
}

// SemHolder is a holder of permits.
type SemHolder struct {
	Owner   string `json:"owner"`
	Label   string `json:"label"`
	Permits int64  `json:"permits"`
	LeaseMS int64  `json:"lease_ms"` // <= 0: ended, reclaimed by the next call
}

// SemWaiter is a queued waiter for permits: one blocked Acquire of the
// holder Owner.
type SemWaiter struct {
	Position     int    `json:"position"`
	Waiter       string `json:"waiter"` // "owner#call"
	Owner        string `json:"owner"`
	Label        string `json:"label"`
	WaitedMS     int64  `json:"waited_ms"` // since it joined the queue
	Permits      int64  `json:"permits"`
	HeartbeatMS  int64  `json:"heartbeat_ms"`
	GrantLeaseMS int64  `json:"grant_lease_ms"` // 0: no record
	Alive        bool   `json:"alive"`
}

// semaphoreStatus converts what InspectSemaphore read.
func semaphoreStatus(s *redisync.SemaphoreState) *SemStatus {
	st := &SemStatus{Size: s.Size, Available: s.Available(), Holders: []SemHolder{}, Queue: []SemWaiter{},
		HoldersLen: s.HoldersLen, QueueLen: s.QueueLen}
	for _, h := range s.Holders {
		st.Holders = append(st.Holders, SemHolder{Owner: h.ID, Label: h.Label, Permits: h.Permits, LeaseMS: h.Lease.Milliseconds()})
	}
	for i, w := range s.Queue {
		st.Queue = append(st.Queue, SemWaiter{Position: i + 1, Waiter: w.ID, Owner: w.Holder, Label: w.Label,
			WaitedMS: w.Waited.Milliseconds(), Permits: w.Permits, HeartbeatMS: w.Heartbeat.Milliseconds(),
			GrantLeaseMS: w.GrantLease.Milliseconds(), Alive: w.Alive})
	}
	return st
}

// printSemaphore writes the semaphore part of st for people.
func printSemaphore(out io.Writer, st *Status) {
	s := st.Semaphore
	fmt.Fprintf(out, "semaphore %q\n", st.Name)
	field(out, "permits", fmt.Sprintf("%d available of %d", s.Available, s.Size))
	if len(s.Holders) == 0 && s.HoldersLen == 0 {
		field(out, "holders", "none")
	} else {
		n := strconv.Itoa(max(s.HoldersLen, len(s.Holders)))
		if s.HoldersLen > len(s.Holders) {
			n += fmt.Sprintf(" (the %d whose leases end first listed)", len(s.Holders))
		}
		field(out, "holders", n)
		rows := [][]string{{"owner", "permits", "lease"}}
		for _, h := range s.Holders {
			lease := ms(h.LeaseMS) + " left"
			if h.LeaseMS <= 0 {
				lease = "ended (reclaimed on the next call)"
			}
			rows = append(rows, []string{h.Owner, strconv.FormatInt(h.Permits, 10), lease})
		}
		table(out, rows)
	}
	if len(s.Queue) == 0 && s.QueueLen == 0 {
		field(out, "queue", "empty")
		return
	}
	field(out, "queue", queueText(s.QueueLen, len(s.Queue)))
	rows := [][]string{{"#", "waiter", "permits", "heartbeat due", "grant lease"}}
	for _, q := range s.Queue {
		due := heartbeatText(Waiter{HeartbeatMS: q.HeartbeatMS, HandoffLeaseMS: q.GrantLeaseMS, Alive: q.Alive})
		rows = append(rows, []string{strconv.Itoa(q.Position), q.Waiter, strconv.FormatInt(q.Permits, 10), due, ms(q.GrantLeaseMS)})
	}
	table(out, rows)
}
