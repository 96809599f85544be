//go:build redisync_sem

// The semaphore part of "redisync status".
//
// ASSUMED KEY LAYOUT (the library's Semaphore is being written as this
// is; adapt readSemaphore to the layout it ends up with). For a semaphore
// NAME under the key prefix P, every key sharing the hash tag {NAME} like
// the lock's keys:
//
//	P:sem:{NAME}          hash    holder id -> permits it holds
//	P:sem:{NAME}:leases   zset    holder id -> lease deadline, ms by the
//	                              Redis server clock (TIME); a holder past
//	                              it is reclaimed by the next script call
//	P:sem:{NAME}:size     string  the semaphore's size, as last given
//	P:sem:{NAME}:queue    zset    waiter id -> arrival number (FIFO)
//	P:sem:{NAME}:waiters  hash    waiter id -> "permits:deadlineMs", the
//	                              deadline of its heartbeat by TIME
//	P:sem:{NAME}:ch       channel wake-ups
//
// Holder and waiter ids are owner ids as minted by a Client, like a lock's.

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

func init() {
	c := lookup("status")
	c.summary = "show who holds lock or semaphore NAME and who waits, in order"
	c.help = strings.Replace(c.help, "waiter's heartbeat deadline.", "waiter's heartbeat deadline; and of the semaphore NAME, if there is one:\nits size, the permits available, the holders with their permits and\nleases, and its queue in order.", 1)
}

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
	Permits int64  `json:"permits"`
	LeaseMS int64  `json:"lease_ms"` // negative: expired, reclaimed by the next call
}

// SemWaiter is a queued waiter for permits.
type SemWaiter struct {
	Position    int    `json:"position"`
	Owner       string `json:"owner"`
	Permits     int64  `json:"permits"`
	HeartbeatMS int64  `json:"heartbeat_ms"`
	Alive       bool   `json:"alive"`
}

// semKeys are the keys of the semaphore name under prefix (see the top
// of this file).
type semKeys struct{ holders, leases, size, queue, waiters string }

func newSemKeys(prefix, name string) semKeys {
	base := prefix + ":sem:{" + name + "}"
	return semKeys{base, base + ":leases", base + ":size", base + ":queue", base + ":waiters"}
}

// readSemaphore queues the reads of the semaphore name on p, a
// transaction, and returns the function that decodes them once it ran:
// nil when the semaphore has no keys.
func readSemaphore(ctx context.Context, p redis.Pipeliner, prefix, name string) func(nowMS int64) (*SemStatus, error) {
	k := newSemKeys(prefix, name)
	holders := p.HGetAll(ctx, k.holders)
	leases := p.ZRangeWithScores(ctx, k.leases, 0, -1)
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
		deadline := map[string]int64{}
		for _, z := range leases.Val() {
			deadline[fmt.Sprint(z.Member)] = int64(z.Score)
		}
		used := int64(0)
		for owner, v := range holders.Val() {
			h := SemHolder{Owner: owner, LeaseMS: -1}
			h.Permits, _ = strconv.ParseInt(v, 10, 64)
			if d, ok := deadline[owner]; ok {
				h.LeaseMS = d - nowMS
			}
			if h.LeaseMS >= 0 {
				used += h.Permits
			}
			s.Holders = append(s.Holders, h)
		}
		slices.SortFunc(s.Holders, func(a, b SemHolder) int { return strings.Compare(a.Owner, b.Owner) })
		s.Available = max(s.Size-used, 0)
		for i, z := range queue.Val() {
			w := SemWaiter{Position: i + 1, Owner: fmt.Sprint(z.Member)}
			if a, b, ok := strings.Cut(waiters.Val()[w.Owner], ":"); ok {
				w.Permits, _ = strconv.ParseInt(a, 10, 64)
				if d, err := strconv.ParseInt(b, 10, 64); err == nil {
					w.HeartbeatMS = d - nowMS
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
	if s == nil {
		fmt.Fprintf(out, "semaphore %q: none\n", st.Name)
		return
	}
	fmt.Fprintf(out, "semaphore %q\n", st.Name)
	field(out, "permits", fmt.Sprintf("%d available of %d", s.Available, s.Size))
	if len(s.Holders) == 0 {
		field(out, "holders", "none")
	} else {
		field(out, "holders", strconv.Itoa(len(s.Holders)))
		rows := [][]string{{"owner", "permits", "lease"}}
		for _, h := range s.Holders {
			lease := ms(h.LeaseMS) + " left"
			if h.LeaseMS < 0 {
				lease = "expired (reclaimed on the next call)"
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
	rows := [][]string{{"#", "owner", "permits", "heartbeat due"}}
	for _, q := range s.Queue {
		due := heartbeatText(Waiter{HeartbeatMS: q.HeartbeatMS, HandoffLeaseMS: 1, Alive: q.Alive})
		rows = append(rows, []string{strconv.Itoa(q.Position), q.Owner, strconv.FormatInt(q.Permits, 10), due})
	}
	table(out, rows)
}
