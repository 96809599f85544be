// The semaphore part of "redisync status".
//
// KEY LAYOUT, as semaphore.go and scripts/sem_*.lua write it. For a
// semaphore NAME under the key prefix P, every key shares the hash tag
// {NAME}:
//
//	P:sem:{NAME}           hash    holder id -> "permits:seq", seq being
//	                               the highest call number applied to it
//	P:sem:{NAME}:expiry    zset    holder id -> end of its lease, ms by the
//	                               Redis server clock (TIME); a holder whose
//	                               lease has ended is reclaimed by the next
//	                               script call
//	P:sem:{NAME}:size      string  the semaphore's size (while in use, and
//	                               an hour after the last Acquire)
//	P:sem:{NAME}:queue     zset    waiter id -> arrival number (FIFO); a
//	                               waiter id is "holder id#call number"
//	P:sem:{NAME}:waiters   hash    waiter id -> "deadline:grantLease:n:seq":
//	                               heartbeat deadline (ms, server clock),
//	                               lease in ms of permits granted to it,
//	                               permits wanted, call number (not read
//	                               here)
//	P:sem:{NAME}:released  zset    recent full releases, for retries (not
//	                               read here)
//	P:sem:{NAME}:ch        channel grant messages
//
// Holder ids are owner ids as minted by a Client, like a lock's.

package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// SemStatus is the state of a semaphore.
type SemStatus struct {
	Size      int64       `json:"size"`
	Available int64       `json:"available"`
	Holders   []SemHolder `json:"holders"`
	Queue     []SemWaiter `json:"queue"`
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
	Arrival      int64  `json:"arrival"`
	Permits      int64  `json:"permits"`
	HeartbeatMS  int64  `json:"heartbeat_ms"`
	GrantLeaseMS int64  `json:"grant_lease_ms"` // 0: no record
	Alive        bool   `json:"alive"`
}

// semKeys are the keys of the semaphore name under prefix that status
// reads (see the top of this file).
type semKeys struct{ holders, expiry, size, queue, waiters string }

func newSemKeys(prefix, name string) semKeys {
	base := prefix + ":sem:{" + name + "}"
	return semKeys{base, base + ":expiry", base + ":size", base + ":queue", base + ":waiters"}
}

// readSemaphore queues the reads of the semaphore name on p, a
// transaction, and returns the function that decodes them once it ran
// with the server time nowMS: nil when the semaphore has no keys.
// Available counts the permits as the next script call would: those of
// holders whose lease has not ended are in use.
func readSemaphore(ctx context.Context, p redis.Pipeliner, prefix, name string) func(nowMS int64) (*SemStatus, error) {
	k := newSemKeys(prefix, name)
	holders := p.HGetAll(ctx, k.holders)
	expiry := p.ZRangeWithScores(ctx, k.expiry, 0, -1)
	size := p.Get(ctx, k.size)
	queue := p.ZRangeWithScores(ctx, k.queue, 0, -1)
	waiters := p.HGetAll(ctx, k.waiters)
	return func(nowMS int64) (*SemStatus, error) {
		if size.Val() == "" && len(holders.Val()) == 0 && len(queue.Val()) == 0 {
			return nil, nil
		}
		s := &SemStatus{Holders: []SemHolder{}, Queue: []SemWaiter{}}
		if v := size.Val(); v != "" {
			var err error
			if s.Size, err = strconv.ParseInt(v, 10, 64); err != nil {
				return nil, fmt.Errorf("the semaphore size key %s holds %q, not a number", k.size, v)
			}
		}
		end := map[string]int64{}
		for _, z := range expiry.Val() {
			end[fmt.Sprint(z.Member)] = int64(z.Score)
		}
		used := int64(0)
		for owner, v := range holders.Val() {
			h := SemHolder{Owner: owner, Label: labelOf(owner)}
			permits, _, _ := strings.Cut(v, ":") // "permits:seq"
			h.Permits, _ = strconv.ParseInt(permits, 10, 64)
			if e, ok := end[owner]; ok {
				h.LeaseMS = e - nowMS
			}
			if h.LeaseMS > 0 {
				used += h.Permits
			}
			s.Holders = append(s.Holders, h)
		}
		slices.SortFunc(s.Holders, func(a, b SemHolder) int { return strings.Compare(a.Owner, b.Owner) })
		s.Available = max(s.Size-used, 0)
		for i, z := range queue.Val() {
			w := SemWaiter{Position: i + 1, Waiter: fmt.Sprint(z.Member), Arrival: int64(z.Score)}
			w.Owner = w.Waiter
			if j := strings.LastIndexByte(w.Waiter, '#'); j >= 0 {
				w.Owner = w.Waiter[:j]
			}
			w.Label = labelOf(w.Owner)
			if f := strings.Split(waiters.Val()[w.Waiter], ":"); len(f) == 4 {
				deadline, err1 := strconv.ParseInt(f[0], 10, 64)
				grant, err2 := strconv.ParseInt(f[1], 10, 64)
				permits, err3 := strconv.ParseInt(f[2], 10, 64)
				if err1 == nil && err2 == nil && err3 == nil {
					w.HeartbeatMS, w.GrantLeaseMS, w.Permits = deadline-nowMS, grant, permits
					w.Alive = w.HeartbeatMS >= 0
				}
			}
			s.Queue = append(s.Queue, w)
		}
		return s, nil
	}
}

// printSemaphore writes the semaphore part of st for people.
func printSemaphore(out io.Writer, st *Status) {
	s := st.Semaphore
	fmt.Fprintf(out, "semaphore %q\n", st.Name)
	field(out, "permits", fmt.Sprintf("%d available of %d", s.Available, s.Size))
	if len(s.Holders) == 0 {
		field(out, "holders", "none")
	} else {
		field(out, "holders", strconv.Itoa(len(s.Holders)))
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
	if len(s.Queue) == 0 {
		field(out, "queue", "empty")
		return
	}
	field(out, "queue", fmt.Sprintf("%d waiting, first come first served", len(s.Queue)))
	rows := [][]string{{"#", "waiter", "permits", "heartbeat due", "grant lease"}}
	for _, q := range s.Queue {
		due := heartbeatText(Waiter{HeartbeatMS: q.HeartbeatMS, HandoffLeaseMS: q.GrantLeaseMS, Alive: q.Alive})
		rows = append(rows, []string{strconv.Itoa(q.Position), q.Waiter, strconv.FormatInt(q.Permits, 10), due, ms(q.GrantLeaseMS)})
	}
	table(out, rows)
}
