package redisync

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
)

// lockAsync runs m.Lock in a goroutine and returns its outcome's channel.
func lockAsync(m *Mutex) <-chan error {
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }()
	return done
}

// The fair waiters of one Client on one lock are kept alive by one
// heartbeat, which moves the Client's deadline and leaves their own
// records alone: its cost does not grow with their number.
func TestWaitersOfOneClientShareOneHeartbeat(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWaiterTimeout(150*time.Millisecond), WithRecheck(time.Hour))
	k := schema.LockKeys("redisync", "shared")
	holder := must(c.NewMutex("shared"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 5
	var ms []*Mutex
	var dones []<-chan error
	for range n {
		m := must(c.NewMutex("shared"))
		ms = append(ms, m)
		dones = append(dones, lockAsync(m))
	}
	eventually(t, 5*time.Second, "the waiters to queue and sleep", func() bool {
		return len(queuedTickets(t, mr, k)) == n && asleep(c) == n
	})
	_, entries := c.wd.Sleepers()
	if entries != 1 {
		t.Fatalf("%d watchdog entries for %d waiters of one Client on one lock; want 1", entries, n)
	}
	// The first heartbeat finds no deadline of the Client yet, and has them
	// all look again once (a release may have dropped them); from then on
	// their records stay as they are while the Client's deadline moves.
	field := schema.ClientField(queuedTickets(t, mr, k)[0])
	records := func() map[string]string {
		m := map[string]string{}
		for _, rec := range queueRecords(t, mr, k) {
			m[rec.Ticket] = rec.String()
		}
		return m
	}
	before, seen := records(), map[string]bool{}
	eventually(t, 5*time.Second, "three heartbeats that leave the waiters' records alone", func() bool {
		if now := records(); !maps.Equal(now, before) {
			before, seen = now, map[string]bool{}
		}
		if v := mr.HGet(k.Hash, field); v != "" {
			seen[v] = true
		}
		return len(seen) >= 3
	})
	// Their own deadlines have passed; the Client's keeps them alive, and
	// each is served in turn.
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	served := merge(dones)
	for range n {
		select {
		case err := <-served:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a live waiter was not served")
		}
		for _, m := range ms {
			if m.current() != nil {
				if err := m.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// With its last waiter gone, the Client's deadline goes too.
	eventually(t, 5*time.Second, "the Client's deadline to go", func() bool { return mr.HGet(k.Hash, field) == "" })
}

// A Client closed while its waiters are queued removes its deadline.
func TestClosedClientRemovesItsDeadline(t *testing.T) {
	mr, rdb, _ := newMini(t)
	a := newClient(t, rdb)
	b := newClient(t, rdb, WithWaiterTimeout(30*time.Millisecond), WithRecheck(time.Hour))
	k := schema.LockKeys("redisync", "closed")
	holder := must(a.NewMutex("closed"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := lockAsync(must(b.NewMutex("closed")))
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return len(queuedTickets(t, mr, k)) == 1 })
	field := schema.ClientField(queuedTickets(t, mr, k)[0])
	eventually(t, 5*time.Second, "a heartbeat", func() bool { return mr.HGet(k.Hash, field) != "" })
	_ = b.Close()
	if err := result(t, done); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lock: %v, want ErrClosed", err)
	}
	if mr.HGet(k.Hash, field) != "" {
		t.Fatalf("the closed Client left its deadline: %v", lockStateOf(t, mr, k).Clients)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// merge returns a channel that receives from any of chans.
func merge(chans []<-chan error) <-chan error {
	out := make(chan error, len(chans))
	for _, ch := range chans {
		go func() {
			if err, ok := <-ch; ok {
				out <- err
			}
		}()
	}
	return out
}

// A fair waiter dropped as dead by a release (its own deadline and its
// Client's had passed: its heartbeats stalled) is told by the next
// heartbeat, which finds the Client's deadline passed, and queues again.
func TestMutexWaiterDroppedAsDeadQueuesAgain(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWaiterTimeout(300*time.Millisecond), WithRecheck(time.Hour))
	k := schema.LockKeys("redisync", "dropped")
	holder, w := must(c.NewMutex("dropped")), must(c.NewMutex("dropped"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := lockAsync(w)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool {
		return len(queuedTickets(t, mr, k)) == 1 && asleep(c) == 1
	})
	rec := queueRecords(t, mr, k)[0]
	ticket := rec.Ticket
	eventually(t, 5*time.Second, "the waiter's own deadline to pass", func() bool {
		return time.Now().UnixMilli() > rec.Deadline
	})
	// Dropped as a release drops a dead waiter: its record leaves the
	// queue's head, and its Client's deadline has passed. In one
	// transaction, so that the waiter's heartbeat sees all of it or none.
	drop := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer drop.Close()
	if _, err := drop.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LPop(ctx, k.Queue)
		p.HSet(ctx, k.Hash, schema.QueueField, 0, schema.PoppedField, rec.Seq, schema.ClientField(ticket), "1")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the waiter to queue again", func() bool {
		q := queuedTickets(t, mr, k)
		return len(q) == 1 && q[0] != ticket
	})
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A hand-off's lease counts from the hand-off. A waiter that waited many
// heartbeats longer than that lease still takes the hold from its grant
// message: its deadline counts from the last heartbeat of its Client that
// ran before the hand-off, not from when it queued (which would find the
// lease run out, give the hold back and queue again under a new ticket).
func TestHandoffAfterLongWaitIsAdoptedFromItsMessage(t *testing.T) {
	for _, sem := range []bool{false, true} {
		t.Run(map[bool]string{false: "mutex", true: "semaphore"}[sem], func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			// Long enough that a loaded machine delivers the grant well
			// within the hand-off lease (the heartbeat).
			const hb = 500 * time.Millisecond
			c := newClient(t, rdb, WithWaiterTimeout(hb), WithRecheck(time.Hour))
			if sem {
				adoptsAfterLongWaitSemaphore(t, mr, c, hb)
			} else {
				adoptsAfterLongWaitMutex(t, mr, c, hb)
			}
		})
	}
}

func adoptsAfterLongWaitMutex(t *testing.T, mr *miniredis.Miniredis, c *Client, hb time.Duration) {
	k := schema.LockKeys("redisync", "long")
	holder, w := must(c.NewMutex("long")), must(c.NewMutex("long"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := lockAsync(w)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool {
		return len(queuedTickets(t, mr, k)) == 1 && asleep(c) == 1
	})
	ticket := queuedTickets(t, mr, k)[0]
	waitHeartbeats(t, mr, k.Hash, schema.ClientField(ticket), 4*hb)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if got := w.holdID(); got != ticket {
		t.Errorf("the hold is %s, not the ticket %s it was handed to: the hand-off was given back", got, ticket)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func adoptsAfterLongWaitSemaphore(t *testing.T, mr *miniredis.Miniredis, c *Client, hb time.Duration) {
	holder, w := must(c.NewSemaphore("s", 1)), must(c.NewSemaphore("s", 1))
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := acquireAsync(ctx, w, 1)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool { return queueLen(t, mr) == 1 && asleep(c) == 1 })
	waiter := queuedWaiter(t, mr)
	waitHeartbeats(t, mr, semKey, schema.ClientField(waiter), 4*hb)
	withdrawn := withdrawnIDs(mr)
	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if after := withdrawnIDs(mr); len(after) > len(withdrawn) {
		t.Errorf("withdrawn after the grant: %v; the grant was given back", after)
	}
	if err := w.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// waitHeartbeats waits until the Client deadline in field of the hash
// waiters (a lock's hash, or a semaphore's waiters hash) has moved for at
// least d.
func waitHeartbeats(t *testing.T, mr *miniredis.Miniredis, waiters, field string, d time.Duration) {
	t.Helper()
	start := time.Now()
	seen := map[string]bool{}
	eventually(t, 5*time.Second, "heartbeats for "+d.String(), func() bool {
		if v := mr.HGet(waiters, field); v != "" {
			seen[v] = true
		}
		return time.Since(start) >= d && len(seen) >= 3
	})
}

// A grant message names its address, its value and the server time of the
// grant; one of an earlier version has no time.
func TestSplitGrant(t *testing.T) {
	for _, tc := range []struct {
		grant, address string
		value, ms      int64
		ok             bool
	}{
		{"app:x/c-1-2-3-4:17:1700000000000", "app:x/c-1-2-3-4", 17, 1700000000000, true},
		{"app:x/c-1-2-3-4:17", "app:x/c-1-2-3-4", 17, 0, true},
		{"a/b/c-9#3:2:1700000000001", "a/b/c-9#3", 2, 1700000000001, true},
		{"a/c-9#3:2", "a/c-9#3", 2, 0, true},
		{"a/c-9:x", "", 0, 0, false},
		{"nocolon", "", 0, 0, false},
	} {
		a, v, ms, ok := waiters.ParseGrant(tc.grant)
		if ok != tc.ok || (ok && (a != tc.address || v != tc.value || ms != tc.ms)) {
			t.Errorf("waiters.ParseGrant(%q) = %q, %d, %d, %v; want %q, %d, %d, %v", tc.grant, a, v, ms, ok, tc.address, tc.value, tc.ms, tc.ok)
		}
	}
	if _, _, ok := parseGrant("a/c-1:5:9", "a/c-2"); ok {
		t.Error("a grant to a/c-1 taken as a/c-2's")
	}
}

// A release that drops a dead waiter drops its Client's deadline with it,
// so that a lock in constant use does not gather those of dead Clients.
func TestReleaseDropsDeadClientsDeadline(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	k := schema.LockKeys("redisync", "dead")
	m := must(c.NewMutex("dead"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	const dead = "app/deadclient-1"
	// Its own deadline (1 ms) and its Client's passed long ago.
	if _, err := mr.RPush(k.Queue, schema.QueueRecord{Seq: 1, Ticket: dead, Joined: 1, Deadline: 1, Handoff: 3000}.String()); err != nil {
		t.Fatal(err)
	}
	mr.HSet(k.Hash, schema.QueueField, "1", schema.SeqField, "1", schema.ClientField(dead), "1")
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	st := lockStateOf(t, mr, k)
	if len(st.Clients) != 0 {
		t.Fatalf("Clients' deadlines left in the lock's hash: %v", st.Clients)
	}
	if st.Owner != "" {
		t.Fatalf("the lock was handed to a dead waiter: owner %q", st.Owner)
	}
	if q := queuedTickets(t, mr, k); len(q) != 0 || st.Queue != 0 {
		t.Fatalf("queue %v (count %d) after the release, want the dead waiter dropped", q, st.Queue)
	}
}

// A heartbeat that finds its Client's deadline passed reports it twice in
// a row: when go-redis runs it again after losing its reply, the run whose
// reply arrives still tells the waiters to look again.
func TestLapseReportedByTwoHeartbeats(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "lapse")
	far := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	mr.HSet(k.Hash, schema.LayoutField, strconv.Itoa(schema.Layout), schema.OwnerField, "app/other-1", schema.EndField, far)
	field := schema.ClientField("app/me-1")
	mr.HSet(k.Hash, field, "1") // passed long ago
	beat := func() int64 {
		t.Helper()
		res, err := renewScript.Run(ctx, rdb, []string{k.Hash, k.Queue}, "wait", "me", 3000).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if r1, r2, r3 := beat(), beat(), beat(); r1 != 3 || r2 != 3 || r3 != 1 {
		t.Fatalf("heartbeats after a lapse replied %d, %d, %d; want 3, 3, 1", r1, r2, r3)
	}
	// Its own deadline (1 ms) passed long ago too.
	if _, err := mr.RPush(k.Queue, schema.QueueRecord{Seq: 1, Ticket: "app/me-2", Joined: 1, Deadline: 1, Handoff: 3000}.String()); err != nil {
		t.Fatal(err)
	}
	mr.HSet(k.Hash, schema.QueueField, "1", schema.SeqField, "1")
	var ins *LockState
	ins, err := newClient(t, rdb).InspectLock(ctx, "lapse")
	if err != nil {
		t.Fatal(err)
	}
	if len(ins.Queue) != 1 || !ins.Queue[0].Alive {
		t.Fatalf("inspect: %+v; want the waiter alive by its Client's deadline", ins.Queue)
	}
}

// Once a waiter's own deadline has passed, its Client's alone keeps it
// alive: the release hands the lock to that very ticket.
func TestClientDeadlineAloneKeepsWaiterAlive(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWaiterTimeout(150*time.Millisecond), WithRecheck(time.Hour))
	k := schema.LockKeys("redisync", "alone")
	holder, m := must(c.NewMutex("alone")), must(c.NewMutex("alone"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := lockAsync(m)
	eventually(t, 5*time.Second, "the waiter to queue and sleep", func() bool {
		return len(queuedTickets(t, mr, k)) == 1 && asleep(c) == 1
	})
	ticket := queuedTickets(t, mr, k)[0]
	eventually(t, 5*time.Second, "its own deadline to pass", func() bool {
		q := queueRecords(t, mr, k)
		return len(q) == 1 && q[0].Ticket == ticket && time.Now().UnixMilli() > q[0].Deadline+50
	})
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if got := m.holdID(); got != ticket {
		t.Fatalf("held under %s, not %s: the waiter was dropped though its Client's deadline was current", got, ticket)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// scriptRuns counts the calls of each script (EVALSHA, or EVAL when
// Redis did not have it yet), by the script's hash.
type scriptRuns struct {
	passHooks
	mu sync.Mutex
	n  map[string]int
}

func (h *scriptRuns) of(s *luaScript) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[s.Hash()]
}

func (h *scriptRuns) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 {
			if src, ok := args[1].(string); ok {
				h.mu.Lock()
				switch strings.ToLower(cmd.Name()) {
				case "evalsha":
					h.n[src]++
				case "eval":
					h.n[testScript(src).Hash()]++
				}
				h.mu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}

// A Client's waiters sleep through its first heartbeats on a lock or a
// semaphore: the first finds no deadline of the Client there yet, and the
// second reports that again (a lapse is told twice), but no waiter can
// have been dropped as dead while its own deadline lasts. Every waiter of
// the Client used to attempt again after each of the two, into every wait
// longer than a heartbeat (at 512 waiters on the hot lock: 0.7 requests
// and 9 calls more per acquisition).
func TestFirstHeartbeatsWakeNoWaiter(t *testing.T) {
	for _, prim := range []string{"mutex", "semaphore"} {
		t.Run(prim, func(t *testing.T) {
			_, rdb, _ := newMini(t)
			runs := &scriptRuns{n: map[string]int{}}
			addHook(rdb, runs)
			c := newClient(t, rdb, WithWaiterTimeout(600*time.Millisecond), WithRecheck(time.Hour))
			const waiters = 3
			var done []<-chan error
			var release func() error
			attempt := acquireScript
			if prim == "mutex" {
				holder := must(c.NewMutex("m"))
				if err := holder.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				release = func() error { return holder.Unlock(ctx) }
				for range waiters {
					m := must(c.NewMutex("m"))
					ch := make(chan error, 1)
					go func() {
						err := m.Lock(ctx)
						if err == nil {
							err = m.Unlock(ctx)
						}
						ch <- err
					}()
					done = append(done, ch)
				}
			} else {
				attempt = semAcquireScript
				holder := must(c.NewSemaphore("s", 1))
				if err := holder.Acquire(ctx, 1); err != nil {
					t.Fatal(err)
				}
				release = func() error { return holder.Release(ctx, 1) }
				for range waiters {
					s := must(c.NewSemaphore("s", 1))
					ch := make(chan error, 1)
					go func() {
						err := s.Acquire(ctx, 1)
						if err == nil {
							err = s.Release(ctx, 1)
						}
						ch <- err
					}()
					done = append(done, ch)
				}
			}
			eventually(t, 5*time.Second, "the waiters to sleep", func() bool { return asleep(c) == waiters })
			before, beats := runs.of(attempt), runs.of(renewScript)
			// Three heartbeats (every 200 ms): the third is sent once the
			// second's reply has been acted on.
			eventually(t, 5*time.Second, "three heartbeats", func() bool { return runs.of(renewScript) >= beats+3 })
			if n := runs.of(attempt) - before; n != 0 {
				t.Errorf("%d attempts during the first heartbeats, want none", n)
			}
			if err := release(); err != nil {
				t.Fatal(err)
			}
			for _, ch := range done {
				if err := result(t, ch); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// withdrawnIDs returns the waiter ids that the test semaphore remembers as
// withdrawn: the members of its ended zset that are waiter ids.
func withdrawnIDs(mr *miniredis.Miniredis) []string {
	members, _ := mr.ZMembers(semKey + ":ended")
	return slices.DeleteFunc(members, func(m string) bool { return !strings.Contains(m, "#") })
}
