// The election part of "redisync status".

package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/redisync/redisync"
)

// ElectStatus is the state of an election: its leader and its candidates
// waiting, next first.
type ElectStatus struct {
	Leader     *Holder  `json:"leader"` // Metadata is the leader's value
	LastToken  int64    `json:"last_token"`
	Candidates []Waiter `json:"candidates"`
	// CandidatesLen counts the candidates' records, of which Candidates
	// lists the first redisync.InspectPage (LockState.QueueLen).
	CandidatesLen int `json:"candidates_len"`
}

// readElection reads the election name through Client.InspectElection,
// in one transaction; nil when nothing of it is stored.
func readElection(ctx context.Context, c *redisync.Client, name string) (*ElectStatus, error) {
	e, err := c.InspectElection(ctx, name)
	if err != nil || e.Empty() {
		return nil, err
	}
	st := &ElectStatus{LastToken: e.LastToken, Candidates: []Waiter{}, CandidatesLen: e.CandidatesLen}
	if l := e.Leader; l != nil {
		st.Leader = &Holder{Owner: l.ID, Label: l.Label, LeaseMS: leaseMS(l.Lease), Token: l.Token, Metadata: l.Value}
	}
	for i, w := range e.Candidates {
		st.Candidates = append(st.Candidates, Waiter{Position: i + 1, Owner: w.ID, Label: w.Label,
			WaitedMS: w.Waited.Milliseconds(), HeartbeatMS: w.Heartbeat.Milliseconds(),
			HandoffLeaseMS: w.HandoffLease.Milliseconds(), Alive: w.Alive, Metadata: w.Value})
	}
	return st, nil
}

// printElection writes the election part of st for people.
func printElection(out io.Writer, st *Status) {
	e := st.Election
	fmt.Fprintf(out, "election %q\n", st.Name)
	if h := e.Leader; h != nil {
		field(out, "leader", h.Owner)
		field(out, "value", strconv.Quote(h.Metadata))
		field(out, "fencing token", strconv.FormatInt(h.Token, 10))
		field(out, "lease", leaseText(h.LeaseMS))
	} else {
		field(out, "leader", "none")
		if e.LastToken > 0 {
			field(out, "last token", strconv.FormatInt(e.LastToken, 10))
		}
	}
	if len(e.Candidates) == 0 && e.CandidatesLen == 0 {
		field(out, "candidates", "none waiting")
		return
	}
	field(out, "candidates", queueText(e.CandidatesLen, len(e.Candidates)))
	rows := [][]string{{"#", "candidate", "waiting for", "heartbeat due", "value"}}
	for _, w := range e.Candidates {
		rows = append(rows, []string{strconv.Itoa(w.Position), w.Owner, ms(w.WaitedMS), heartbeatText(w), strconv.Quote(w.Metadata)})
	}
	table(out, rows)
}
