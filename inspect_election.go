package redisync

import (
	"cmp"
	"context"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// ElectionState is the state of an election as InspectElection read it, at
// one instant.
type ElectionState struct {
	Name       string
	ServerTime time.Time // the Redis server's clock at the instant read
	// Leader is the leader, nil when nobody leads.
	Leader *ElectionLeader
	// LastToken is the last fencing token issued: the leader's while one
	// leads; after it resigned, remembered for an hour (0 once forgotten).
	LastToken int64
	// Candidates is the candidates waiting in Campaign, the next to lead
	// first: the first InspectPage of them.
	Candidates []ElectionCandidate
	// CandidatesLen counts the candidates' records, all of them, as
	// LockState.QueueLen counts a lock's.
	CandidatesLen int
	// Subscribers counts the processes subscribed to their grant channels
	// of the election, as for a lock (LockState.Subscribers).
	Subscribers int64
}

// Empty reports whether nothing of the election is stored: no leader, no
// token remembered, no candidate.
func (s *ElectionState) Empty() bool {
	return s.Leader == nil && s.LastToken == 0 && s.CandidatesLen == 0 && len(s.Candidates) == 0
}

// ElectionLeader is the leader of an election.
type ElectionLeader struct {
	ID    string // the hold id: label "/" client id "-" number
	Label string // who leads, for people (see WithLabel)
	Value string // the leader's value, given to Campaign or Proclaim
	// Token is the fencing token of the leader's term.
	Token int64
	// Lease is the time left before the leadership ends unless the leader
	// renews it; negative when the key has no expiry (not redisync's
	// doing).
	Lease time.Duration
}

// ElectionCandidate is a candidate waiting to lead: one blocked Campaign.
type ElectionCandidate struct {
	ID     string        // the call's ticket: label "/" client id "-" number
	Label  string        // whose call, for people (see WithLabel)
	Value  string        // the value it will lead with, given to Campaign
	Waited time.Duration // since it joined the queue, by the server's clock
	// Heartbeat, HandoffLease and Alive are as for a lock's waiter
	// (LockWaiter's).
	Heartbeat    time.Duration
	HandoffLease time.Duration
	Alive        bool
}

// InspectElection reads the state of the election called name: its
// leader with its value, fencing token and remaining lease, and the first
// InspectPage candidates waiting, next first, with their count. It reads
// as InspectLock does. Only WithKeyPrefix applies to it, naming the keys
// as for NewElection; any other option is ErrInvalidOption.
func (c *Client) InspectElection(ctx context.Context, name string, opts ...Option) (*ElectionState, error) {
	cfg := with(c.cfg, atInspect, opts)
	if err := cmp.Or(checkName(name), cfg.err, c.usable(), ctx.Err()); err != nil {
		return nil, wrapOp("inspect election", name, err)
	}
	l, err := c.inspectLock(ctx, name, schema.ElectionKeys(cfg.prefix, name))
	if err != nil {
		return nil, wrapOp("inspect election", name, err)
	}
	return electionState(l), nil
}

// electionState describes the lock under an election, l, as the election
// it is: its holder is the leader, its metadata the leader's value, its
// queue the candidates.
func electionState(l *LockState) *ElectionState {
	st := &ElectionState{Name: l.Name, ServerTime: l.ServerTime, LastToken: l.LastToken, Candidates: []ElectionCandidate{},
		CandidatesLen: l.QueueLen, Subscribers: l.Subscribers}
	if h := l.Holder; h != nil {
		st.Leader = &ElectionLeader{ID: h.ID, Label: h.Label, Value: h.Metadata, Token: h.Token, Lease: h.Lease}
	}
	for _, w := range l.Queue {
		st.Candidates = append(st.Candidates, ElectionCandidate{ID: w.ID, Label: w.Label, Value: w.Metadata,
			Waited: w.Waited, Heartbeat: w.Heartbeat, HandoffLease: w.HandoffLease, Alive: w.Alive})
	}
	return st
}
