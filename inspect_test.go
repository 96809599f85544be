package redisync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

func TestInspectLockFreeHeldAndQueued(t *testing.T) {
	_, rdb, _ := newMini(t)
	hb := 600 * time.Millisecond
	holder := newClient(t, rdb, WithLabel("web-1"), WithWaiterTimeout(hb))
	waitA := newClient(t, rdb, WithLabel("worker-a"), WithWaiterTimeout(hb))
	waitB := newClient(t, rdb, WithLabel("worker-b"), WithWaiterTimeout(hb))

	st, err := holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if st.Held() || st.LastToken != 0 || len(st.Queue) != 0 || st.Name != "job" {
		t.Fatalf("a lock never taken: %+v", st)
	}

	m := must(holder.NewMutex("job"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := m.HoldContext(ctx)
	defer hcancel()
	if err := m.Lock(hctx); err != nil { // re-entered: Redis counts one hold
		t.Fatal(err)
	}
	st, err = holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	h := st.Holder
	if h == nil || h.Label != "web-1" || !strings.HasPrefix(h.ID, "web-1/") ||
		h.Token != m.Token() || st.LastToken != m.Token() || h.Lease <= 0 || h.Lease > 30*time.Second {
		t.Fatalf("held twice: %+v (token %d)", h, m.Token())
	}

	// Two fair waiters, a before b.
	var wg sync.WaitGroup
	defer wg.Wait()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ma, mb := must(waitA.NewMutex("job")), must(waitB.NewMutex("job"))
	errs := make(chan error, 2)
	queued := func(n int) func() bool {
		return func() bool {
			st, err := holder.InspectLock(ctx, "job")
			return err == nil && len(st.Queue) == n
		}
	}
	for i, w := range []*Mutex{ma, mb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.Lock(lctx)
		}()
		eventually(t, 5*time.Second, "waiter to queue", queued(i+1))
	}
	st, err = holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Queue) != 2 || st.Queue[0].Label != "worker-a" || st.Queue[1].Label != "worker-b" {
		t.Fatalf("queue %+v", st.Queue)
	}
	for _, w := range st.Queue {
		if !w.Alive || w.Heartbeat <= 0 || w.Heartbeat > hb || w.HandoffLease != hb || w.Waited < 0 || w.Waited > time.Minute {
			t.Errorf("waiter %+v", w)
		}
	}
	if st.Queue[0].Waited < st.Queue[1].Waited {
		t.Errorf("the first waiter waited %v, less than the second's %v", st.Queue[0].Waited, st.Queue[1].Waited)
	}
	// A waiter may queue before its subscription is confirmed (its first
	// attempt is sent at once); it sleeps only once it is.
	eventually(t, 5*time.Second, "two subscribed processes (the waiters' clients)", func() bool {
		st, err := holder.InspectLock(ctx, "job")
		return err == nil && st.Subscribers == 2
	})

	// Released: the lock is handed to a, b stays queued.
	for range 2 {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	st, err = holder.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if st.Holder == nil || st.Holder.Label != "worker-a" || st.Holder.Token != ma.Token() || st.Holder.Token <= h.Token ||
		len(st.Queue) != 1 || st.Queue[0].Label != "worker-b" {
		t.Fatalf("after the hand-off: holder %+v, queue %+v", st.Holder, st.Queue)
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("b: %v", err)
	}
	if err := ma.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestInspectSemaphoreWeightedAndExpired(t *testing.T) {
	mr, rdb, _ := newMini(t)
	a := newClient(t, rdb, WithLabel("a"))
	b := newClient(t, rdb, WithLabel("b"))
	w := newClient(t, rdb, WithLabel("w"))

	st, err := a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Empty() || st.Available() != 0 {
		t.Fatalf("a semaphore never used: %+v", st)
	}

	sa, sb := must(a.NewSemaphore("gpus", 5)), must(b.NewSemaphore("gpus", 5))
	if err := sa.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := sb.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- must(w.NewSemaphore("gpus", 5)).Acquire(wctx, 2) }()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool {
		st, err := a.InspectSemaphore(ctx, "gpus")
		return err == nil && len(st.Queue) == 1
	})
	st, err = a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	if st.Size != 5 || st.InUse != 5 || st.Available() != 0 || len(st.Holders) != 2 {
		t.Fatalf("state %+v", st)
	}
	if h := st.Holders[0]; h.Label != "a" || h.Permits != 2 || h.Lease <= 0 {
		t.Errorf("holder a %+v", h)
	}
	if h := st.Holders[1]; h.Label != "b" || h.Permits != 3 || h.Lease <= 0 {
		t.Errorf("holder b %+v", h)
	}
	q := st.Queue[0]
	if q.Label != "w" || q.Permits != 2 || !q.Alive || !strings.HasPrefix(q.ID, q.Holder+"#") || q.GrantLease <= 0 {
		t.Errorf("waiter %+v", q)
	}

	// b's lease ends (its expiry moved into the past, as when its process
	// stopped): its permits count as free, though the record stays until
	// the semaphore's next call reclaims it.
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, err := mr.ZAdd(sb.keys.Expiry, float64(time.Now().Add(-time.Second).UnixMilli()), sb.holdID()); err != nil {
		t.Fatal(err)
	}
	st, err = a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	if st.InUse != 2 || st.Available() != 3 || len(st.Holders) != 2 || st.Holders[1].Lease > 0 {
		t.Fatalf("after b's lease ended: %+v", st)
	}
	if err := sa.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// b's Release finds its permits reclaimed.
	if err := sb.Release(ctx, 3); !errors.Is(err, ErrLockLost) {
		t.Fatalf("b's Release after its lease ended: %v", err)
	}
}

func TestInspectRefusesBadInputAndWrongTypes(t *testing.T) {
	mr, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	if _, err := c.InspectLock(ctx, ""); !errors.Is(err, ErrInvalidName) {
		t.Errorf("empty name: %v", err)
	}
	if _, err := c.InspectSemaphore(ctx, "x", WithKeyPrefix("a{b")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("bad prefix: %v", err)
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands sent for bad input", n)
	}
	if err := mr.Set("redisync:lock:{x}", "a string"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.InspectLock(ctx, "x"); !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), `inspect lock "x"`) {
		t.Errorf("a string lock key: %v", err)
	}
	mr.HSet("redisync:lock:{y}", "someone", "not a count")
	if _, err := c.InspectLock(ctx, "y"); !errors.Is(err, ErrWrongType) {
		t.Errorf("a lock hash without a count: %v", err)
	}
	mr.HSet("redisync:sem:{z}", "{size}", "five")
	if _, err := c.InspectSemaphore(ctx, "z"); !errors.Is(err, ErrWrongType) {
		t.Errorf("a size that is not a number: %v", err)
	}
	_ = c.Close()
	if _, err := c.InspectLock(ctx, "x"); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// A label may hold '#' (any printable ASCII but space
// and braces); a semaphore waiter id is "holder id#call". InspectSemaphore
// cuts the id at the first '#', the scripts (sem_holder) at the last: the
// waiter's Holder and Label come out wrong.
func TestInspectSemaphoreWaiterWithHashInLabel(t *testing.T) {
	_, rdb, _ := newMini(t)
	a := newClient(t, rdb, WithLabel("a"))
	w := newClient(t, rdb, WithLabel("pool#2"))
	sa := must(a.NewSemaphore("gpus", 1))
	if err := sa.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	sw := must(w.NewSemaphore("gpus", 1))
	go func() { done <- sw.Acquire(wctx, 1) }()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool {
		st, err := a.InspectSemaphore(ctx, "gpus")
		return err == nil && len(st.Queue) == 1
	})
	st, err := a.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	q := st.Queue[0]
	if want := q.ID[:strings.LastIndexByte(q.ID, '#')]; q.Holder != want || q.Label != "pool#2" {
		t.Errorf("waiter %q: holder %q, label %q; want holder %q, label %q", q.ID, q.Holder, q.Label, want, "pool#2")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err := sa.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// readRecorder records the commands sent in pipelines and transactions.
type readRecorder struct {
	passDial
	mu   sync.Mutex
	cmds [][]any
}

func (r *readRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (r *readRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.mu.Lock()
		for _, cmd := range cmds {
			r.cmds = append(r.cmds, cmd.Args())
		}
		r.mu.Unlock()
		return next(ctx, cmds)
	}
}

// checkBounded fails t unless every read recorded since reset reads at
// most a page of a list, and none reads a whole hash.
func (r *readRecorder) checkBounded(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, args := range r.cmds {
		name := strings.ToLower(fmt.Sprint(args[0]))
		switch {
		case name == "hgetall" || name == "hvals" || name == "hkeys" || name == "smembers":
			t.Errorf("%v reads a whole hash", args)
		case name == "lrange" || name == "zrange":
			if start, stop := fmt.Sprint(args[2]), fmt.Sprint(args[3]); start != "0" || stop != strconv.Itoa(InspectPage-1) {
				t.Errorf("%v reads more than the first %d", args, InspectPage)
			}
		case name == "hmget" && len(args)-2 > len(lockFields)+2*InspectPage:
			t.Errorf("%s of %d fields", name, len(args)-2)
		case name == "pubsub" && len(args) > 1:
			if sub := strings.ToLower(fmt.Sprint(args[1])); sub == "channels" || sub == "shardchannels" {
				t.Errorf("%v reads every channel of the server", args)
			} else if len(args)-2 > 1+2*InspectPage {
				t.Errorf("PUBSUB %s of %d channels", sub, len(args)-2)
			}
		}
	}
	r.cmds = nil
}

// A queue longer than InspectPage is read a page at a time: the first
// InspectPage records, in order, with the queue's length; the Clients'
// records are read for the page's waiters only.
func TestInspectLockReadsTheFirstPageOfALongQueue(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &readRecorder{}
	addHook(rdb, rec)
	c := newClient(t, rdb, WithLabel("holder"))
	m := must(c.NewMutex("job"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	const waiters = 3 * InspectPage
	now := time.Now().UnixMilli()
	// A record that is not redisync's first (the next hand-off drops
	// it), then waiters whose own deadline has passed: those of even
	// number live on their Client's deadline, those of odd number are
	// dead.
	records := []any{"not a record"}
	var clients []any
	for i := range waiters {
		ticket := fmt.Sprintf("w%d/c%d-1", i, i)
		records = append(records, schema.QueueRecord{Seq: int64(i + 1), Ticket: ticket, Joined: now - 1000 + int64(i),
			Deadline: now - 1, Handoff: 5000, Metadata: "m" + strconv.Itoa(i)}.String())
		if i%2 == 0 {
			clients = append(clients, schema.ClientField(ticket), strconv.FormatInt(now+60_000, 10))
		}
	}
	if err := rdb.RPush(ctx, m.keys.Queue, records...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, m.keys.Hash, clients...).Err(); err != nil {
		t.Fatal(err)
	}
	// The processes of a Client in the page, and of one past it,
	// subscribe to their grant channels: the first is counted.
	for _, client := range []string{"c0", "c250"} {
		ps := rdb.Subscribe(ctx, m.keys.GrantChannel(client))
		defer ps.Close()
		if _, err := ps.Receive(ctx); err != nil { // the confirmation
			t.Fatal(err)
		}
	}
	rec.checkBounded(t)

	st, err := c.InspectLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	rec.checkBounded(t)
	if st.Subscribers != 1 {
		t.Errorf("Subscribers = %d, want 1 (the Client in the page)", st.Subscribers)
	}
	if st.QueueLen != waiters+1 || len(st.Queue) != InspectPage-1 {
		t.Fatalf("QueueLen %d, %d listed; want %d, %d (the first page less the record that is not redisync's)",
			st.QueueLen, len(st.Queue), waiters+1, InspectPage-1)
	}
	for i, w := range st.Queue {
		if want := fmt.Sprintf("w%d/c%d-1", i, i); w.ID != want || w.Label != fmt.Sprintf("w%d", i) || w.Metadata != "m"+strconv.Itoa(i) {
			t.Fatalf("Queue[%d] = %+v, want %s", i, w, want)
		}
		if w.Alive != (i%2 == 0) {
			t.Errorf("Queue[%d] (%s): Alive %v, heartbeat %v", i, w.ID, w.Alive, w.Heartbeat)
		}
	}
	if st.Holder == nil || st.Holder.Token != m.Token() {
		t.Errorf("holder %+v, want the token %d", st.Holder, m.Token())
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A semaphore's holders and queue are read a page at a time too, with
// their counts; the count of permits in use that the holders hash keeps
// is no holder, and gives InUse when the holders fill more than a page.
func TestInspectSemaphoreReadsTheFirstPageOfEach(t *testing.T) {
	_, rdb, _ := newMini(t)
	rec := &readRecorder{}
	addHook(rdb, rec)
	c := newClient(t, rdb)
	k := schema.SemaphoreKeys("redisync", "gpus")
	now := time.Now()
	const holders, ended, waiters = InspectPage + InspectPage/2, 5, 3 * InspectPage
	var hs []any
	var exp []redis.Z
	for i := range holders {
		id := fmt.Sprintf("h%03d/c%d-1", holders-i, i) // IDs in the reverse order of the leases
		hs = append(hs, id, "1:1")
		end := now.Add(time.Minute + time.Duration(i)*time.Millisecond)
		if i < ended {
			end = now.Add(-time.Second)
		}
		exp = append(exp, redis.Z{Score: float64(end.UnixMilli()), Member: id})
	}
	hs = append(hs, schema.SemUsedField, strconv.Itoa(holders)+":5")
	var q []redis.Z
	var ws []any
	for i := range waiters {
		id := fmt.Sprintf("w%d/c%d-1#7", i, i)
		q = append(q, redis.Z{Score: float64(now.UnixMicro() - 1000 + int64(i)), Member: id})
		ws = append(ws, id, fmt.Sprintf("%d:5000:%d:7", now.Add(time.Minute).UnixMilli(), i+1))
	}
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k.Hash, "{size}", "1000:5")
		p.HSet(ctx, k.Hash, hs...)
		p.ZAdd(ctx, k.Expiry, exp...)
		p.ZAdd(ctx, k.Queue, q...)
		p.HSet(ctx, k.Hash, ws...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rec.checkBounded(t)

	st, err := c.InspectSemaphore(ctx, "gpus")
	if err != nil {
		t.Fatal(err)
	}
	rec.checkBounded(t)
	if st.HoldersLen != holders || len(st.Holders) != InspectPage || st.InUse != holders-ended || st.Size != 1000 {
		t.Fatalf("HoldersLen %d, %d listed, InUse %d, size %d; want %d, %d, %d, 1000",
			st.HoldersLen, len(st.Holders), st.InUse, st.Size, holders, InspectPage, holders-ended)
	}
	// The page is of the leases that end first, ordered by ID.
	for i, h := range st.Holders {
		if want := fmt.Sprintf("h%03d/c%d-1", holders-(InspectPage-1-i), InspectPage-1-i); h.ID != want || h.Permits != 1 {
			t.Fatalf("Holders[%d] = %+v, want %s", i, h, want)
		}
		if ended := i >= InspectPage-ended; ended != (h.Lease <= 0) {
			t.Errorf("Holders[%d] = %+v: lease ended %v", i, h, h.Lease <= 0)
		}
	}
	if st.QueueLen != waiters || len(st.Queue) != InspectPage {
		t.Fatalf("QueueLen %d, %d listed; want %d, %d", st.QueueLen, len(st.Queue), waiters, InspectPage)
	}
	for i, w := range st.Queue {
		if want := fmt.Sprintf("w%d/c%d-1#7", i, i); w.ID != want || w.Permits != int64(i+1) || !w.Alive || w.Label != fmt.Sprintf("w%d", i) {
			t.Fatalf("Queue[%d] = %+v, want %s alive, wanting %d", i, w, want, i+1)
		}
	}

	// All the holders on one page: InUse counts their live leases.
	small := schema.SemaphoreKeys("redisync", "small")
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, small.Hash, "a/c1-1", "2:1", "b/c2-1", "1:1", schema.SemUsedField, "3:5", "{size}", "3:5")
		p.ZAdd(ctx, small.Expiry, redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: "a/c1-1"},
			redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: "b/c2-1"})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err = c.InspectSemaphore(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	if st.HoldersLen != 2 || len(st.Holders) != 2 || st.Holders[0].ID != "a/c1-1" || st.Holders[1].ID != "b/c2-1" || st.InUse != 2 || st.Empty() {
		t.Fatalf("two holders, one of them ended: %+v", st)
	}
}
