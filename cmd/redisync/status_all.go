// "redisync status" without a NAME: every lock, semaphore, read-write lock
// and election under the prefix that is held or waited for.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// Listing is what "redisync status" lists without a NAME.
type Listing struct {
	// Servers are the servers read, with --verbose (see Status).
	Servers []ServerStatus `json:"servers,omitempty"`
	Prefix  string         `json:"prefix"`
	// Entries are the primitives held or waited for, by kind, then name.
	Entries []Entry `json:"entries"`
	// More is true when --limit left out others.
	More bool `json:"more"`
}

// Entry is one primitive held or waited for.
type Entry struct {
	Kind    string        `json:"kind"` // "lock", "semaphore", "rwmutex" or "election"
	Name    string        `json:"name"`
	Holders []EntryHolder `json:"holders"` // the leader, of an election
	Waiting int           `json:"waiting"` // queued waiters (candidates, of an election)
	// Size and Available are a semaphore's permits; nil for other kinds.
	Size      *int64 `json:"size,omitempty"`
	Available *int64 `json:"available,omitempty"`
	// Error says why the entry could not be read (a key of the wrong
	// type under its name); its other fields are then empty.
	Error string `json:"error,omitempty"`
}

// EntryHolder is a holder of an Entry.
type EntryHolder struct {
	Owner   string `json:"owner"`
	Label   string `json:"label"`
	Permits int64  `json:"permits,omitempty"` // a semaphore's
	Write   bool   `json:"write,omitempty"`   // a read-write lock's writer
	Value   string `json:"value,omitempty"`   // an election leader's
}

// kinds are the kinds of primitives listed, by the kind in their keys
// (internal/schema), in the order listed.
var kinds = []struct{ key, name string }{{"lock", "lock"}, {"sem", "semaphore"}, {"rw", "rwmutex"}, {"elect", "election"}}

// candidate is a primitive that may be held or waited for: one that has
// its main key or its queue.
type candidate struct {
	kind int // index in kinds
	name string
}

// listStatus lists the primitives under prefix that are held or waited
// for, at most limit of them (0: all). It reads the key names with SCAN
// (on every primary of a cluster), then each primitive as status NAME
// does. With servers, it first reads which servers these are.
func listStatus(ctx context.Context, rdb redis.UniversalClient, prefix string, limit int, servers bool) (*Listing, error) {
	c, err := redisync.New(rdb, redisync.WithKeyPrefix(prefix))
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	l := &Listing{Prefix: prefix, Entries: []Entry{}}
	if servers {
		if l.Servers, err = readServers(ctx, c); err != nil {
			return nil, err
		}
	}
	cands, err := scanCandidates(ctx, rdb, prefix)
	if err != nil {
		return nil, err
	}
	for _, cand := range cands {
		e, err := inspectEntry(ctx, c, cand)
		switch {
		case errors.Is(err, redisync.ErrInvalidName):
			continue // a key that looks like one of redisync's, of no name redisync gives
		case errors.Is(err, redisync.ErrWrongType):
			// Another program's key under the prefix: listed as such,
			// and the listing goes on.
			e = &Entry{Kind: kinds[cand.kind].name, Name: cand.name, Holders: []EntryHolder{}, Error: trimPrefix(err)}
		case err != nil:
			return nil, err
		}
		if e == nil {
			continue
		}
		if limit > 0 && len(l.Entries) == limit {
			l.More = true
			break
		}
		l.Entries = append(l.Entries, *e)
	}
	return l, nil
}

// scanCandidates returns the primitives under prefix whose main key or
// queue exists, by kind, then name.
func scanCandidates(ctx context.Context, rdb redis.UniversalClient, prefix string) ([]candidate, error) {
	var mu sync.Mutex
	found := map[candidate]bool{}
	scan := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, globEscape(prefix)+":*", 1000).Iterator()
		for iter.Next(ctx) {
			if cand, ok := parseKey(prefix, iter.Val()); ok {
				mu.Lock()
				found[cand] = true
				mu.Unlock()
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	} else {
		err = scan(ctx, rdb)
	}
	if err != nil {
		return nil, err
	}
	out := make([]candidate, 0, len(found))
	for cand := range found {
		out = append(out, cand)
	}
	slices.SortFunc(out, func(a, b candidate) int {
		if a.kind != b.kind {
			return a.kind - b.kind
		}
		return strings.Compare(a.name, b.name)
	})
	return out, nil
}

// parseKey returns the primitive whose main key or queue key is key:
// "prefix:kind:{name}", or that followed by ":waiting" (a lock's or an
// election's queue), ":queue" (a semaphore's) or ":bargers" (the record
// of a lock's barging waiters). A name is the hash tag, between
// the first "{" and the "}" before the suffix.
func parseKey(prefix, key string) (candidate, bool) {
	rest, ok := strings.CutPrefix(key, prefix+":")
	if !ok {
		return candidate{}, false
	}
	for i, k := range kinds {
		tagged, ok := strings.CutPrefix(rest, k.key+":{")
		if !ok {
			continue
		}
		for _, suffix := range []string{"}", "}:queue", "}:waiting", "}:bargers"} {
			lockish := k.key == "lock" || k.key == "elect"
			if name, ok := strings.CutSuffix(tagged, suffix); ok && name != "" && (suffix != "}:bargers" || k.key == "lock") &&
				(suffix != "}:waiting" || lockish) && (suffix != "}:queue" || !lockish) {
				return candidate{i, name}, true
			}
		}
	}
	return candidate{}, false
}

// globEscape escapes the characters that SCAN's MATCH pattern gives a
// meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// inspectEntry reads cand as status NAME does, and returns its entry, or
// nil when it is neither held nor waited for.
func inspectEntry(ctx context.Context, c *redisync.Client, cand candidate) (*Entry, error) {
	e := &Entry{Kind: kinds[cand.kind].name, Name: cand.name, Holders: []EntryHolder{}}
	switch kinds[cand.kind].key {
	case "lock":
		l, err := c.InspectLock(ctx, cand.name)
		if err != nil {
			return nil, err
		}
		if h := l.Holder; h != nil {
			e.Holders = append(e.Holders, EntryHolder{Owner: h.ID, Label: h.Label})
		}
		e.Waiting = max(l.QueueLen, len(l.Queue)) // all queued, past the page listed; barging waiters are not queued: "status NAME" counts their processes
	case "elect":
		l, err := c.InspectElection(ctx, cand.name)
		if err != nil {
			return nil, err
		}
		if h := l.Leader; h != nil {
			e.Holders = append(e.Holders, EntryHolder{Owner: h.ID, Label: h.Label, Value: h.Value})
		}
		e.Waiting = max(l.CandidatesLen, len(l.Candidates))
	case "sem":
		s, err := c.InspectSemaphore(ctx, cand.name)
		if err != nil {
			return nil, err
		}
		for _, h := range s.Holders {
			if h.Lease > 0 { // else ended: reclaimed by the next call
				e.Holders = append(e.Holders, EntryHolder{Owner: h.ID, Label: h.Label, Permits: h.Permits})
			}
		}
		e.Waiting = max(s.QueueLen, len(s.Queue)) // all queued, past the page listed
		size, available := s.Size, s.Available()
		e.Size, e.Available = &size, &available
	case "rw":
		s, err := c.InspectRWMutex(ctx, cand.name)
		if err != nil {
			return nil, err
		}
		if w := s.Writer; w != nil && w.Lease > 0 {
			e.Holders = append(e.Holders, EntryHolder{Owner: w.ID, Label: w.Label, Write: true})
		}
		for _, r := range s.Readers {
			if r.Lease > 0 {
				e.Holders = append(e.Holders, EntryHolder{Owner: r.ID, Label: r.Label})
			}
		}
		e.Waiting = max(s.QueueLen, len(s.Queue))
	}
	if len(e.Holders) == 0 && e.Waiting == 0 {
		return nil, nil
	}
	return e, nil
}

// print writes l for people: one line per entry.
func (l *Listing) print(out io.Writer) {
	if len(l.Entries) == 0 {
		fmt.Fprintf(out, "nothing held or waited for under the prefix %q\n", l.Prefix)
		return
	}
	rows := [][]string{{"KIND", "NAME", "HELD BY", "WAITING"}}
	for _, e := range l.Entries {
		var who []string
		for _, h := range e.Holders {
			s := h.Label
			switch {
			case h.Write:
				s += " (write)"
			case e.Kind == "rwmutex":
				s += " (read)"
			case e.Kind == "semaphore":
				s += " (" + strconv.FormatInt(h.Permits, 10) + ")"
			case e.Kind == "election":
				s += " " + strconv.Quote(h.Value)
			}
			who = append(who, s)
		}
		if len(who) == 0 {
			who = []string{"-"}
		}
		if e.Error != "" {
			who = []string{"? " + e.Error}
		}
		if e.Size != nil {
			who[len(who)-1] += fmt.Sprintf("; %d of %d free", *e.Available, *e.Size)
		}
		rows = append(rows, []string{e.Kind, strconv.Quote(e.Name), strings.Join(who, ", "), strconv.Itoa(e.Waiting)})
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
	if l.More {
		fmt.Fprintf(out, "(more not shown: --limit %d)\n", len(l.Entries))
	}
}
