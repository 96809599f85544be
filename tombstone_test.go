package redisync

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// A lock's ticket whose call withdrew while a call of it might still be on
// its way (a withdrawal with refusal) has a tombstone (lock_lib.lua,
// withdraw): "withdrawn", for an hour, with the lock's {refuse} field
// saying until when one may exist. Every script that can take a hold
// under the ticket refuses it while the tombstone exists. A release
// writes none: the lock's {token} tells a retried release that it applied.

// tombAcquire returns an attempt of ticket, in mode, on the lock "tomb".
func tombAcquire(ticket, mode string) scriptCall {
	return acquireArgs{ticket: ticket, lease: time.Minute, mode: mode, heartbeat: 3 * time.Second,
		handoff: 3 * time.Second, publish: "PUBLISH"}.call(schema.LockKeys("redisync", "tomb"))
}

// tombRecord returns the queue record of ticket that an attempt in mode
// "queue" made, from its reply res ({0, ms, seq, until}).
func tombRecord(ticket string, res []int64) string {
	return schema.QueueRecord{Seq: res[2], Ticket: ticket, Joined: res[3] - (3 * time.Second).Milliseconds(),
		Deadline: res[3], Handoff: (3 * time.Second).Milliseconds()}.String()
}

// A late copy of any attempt of a withdrawn call takes nothing: not the
// free lock (barging, fair, try, or a MultiMutex's), and not a place in
// the queue.
func TestTombstoneWithdrawnTicketTakesNothing(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const ticket = "vm/1/c-1"
	withdraw := releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw", refuse: true}.call(k)
	if res, err := withdraw.run(ctx, rdb).Int64(); err != nil || res != 1 {
		t.Fatalf("withdraw: %v, %v; want 1 (withdrawn)", res, err)
	}
	if v, _ := mr.Get(k.Tombstone(ticket)); v != "withdrawn" {
		t.Fatalf("tombstone %q, want withdrawn", v)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != time.Hour {
		t.Fatalf("tombstone TTL %v, want an hour", ttl)
	}
	for _, mode := range []string{"barge", "queue", "try"} {
		res, err := tombAcquire(ticket, mode).run(ctx, rdb).Int64Slice()
		if err != nil || len(res) != 2 || res[0] != -2 {
			t.Errorf("a late %s attempt: %v, %v; want {-2, 0}", mode, res, err)
		}
	}
	multi := multiAcquireArgs{ticket: ticket, lease: time.Minute}.call([]schema.Lock{k})
	if res, err := multi.run(ctx, rdb).Int64Slice(); err != nil || len(res) != 1 || res[0] != -2 {
		t.Errorf("a late MultiMutex attempt: %v, %v; want {-2}", res, err)
	}
	// The lock's hash records the refusal; nothing else is written.
	if keys := mr.Keys(); len(keys) != 2 || keys[0] != k.Hash || keys[1] != k.Tombstone(ticket) {
		t.Errorf("keys %q, want only the lock's hash and the tombstone", keys)
	}
	if st := lockStateOf(t, mr, k); st.Owner != "" || st.Token != 0 || st.Queue != 0 {
		t.Errorf("lock state %+v after the late attempts, want nothing taken", st)
	}
}

// A release writes no tombstone: a retried release finds the lock's
// {token} still the hold's and reports success (released by an earlier
// try), also after a withdrawal of the same ticket (a late reply of an
// abandoned attempt withdraws it while Unlock is retried), which leaves
// its own tombstone, for an hour.
func TestTombstoneRetriedReleaseFindsTheTokenUnchanged(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const ticket = "vm/1/c-1"
	res, err := tombAcquire(ticket, "queue").run(ctx, rdb).Int64Slice()
	if err != nil || res[0] != 1 {
		t.Fatalf("acquire: %v, %v", res, err)
	}
	release := releaseArgs{id: ticket, token: res[1], publish: "PUBLISH", mode: "release"}.call(k)
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Fatalf("release: %v, %v", n, err)
	}
	if mr.Exists(k.Tombstone(ticket)) {
		t.Fatalf("the release wrote a tombstone")
	}
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Errorf("the retried release: %v, %v; want 1 (applied)", n, err)
	}
	withdraw := releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw", refuse: true}.call(k)
	if n, err := withdraw.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Fatalf("withdraw: %v, %v; want 1", n, err)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != time.Hour {
		t.Errorf("tombstone TTL %v after the withdrawal, want an hour", ttl)
	}
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Errorf("the release retried after the withdrawal: %v, %v; want 1 (applied)", n, err)
	}
	if res, err := tombAcquire(ticket, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the acquire: %v, %v; want {-2, 0}", res, err)
	}
	// Another hold taken since: the retried release still knows it
	// applied (the last release ended its hold), and touches nothing.
	if res, err := tombAcquire("vm/1/c-2", "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != 1 {
		t.Fatalf("another acquire: %v, %v", res, err)
	}
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Errorf("the release retried after a later hold: %v, %v; want 1", n, err)
	}
	if st := lockStateOf(t, mr, k); st.Owner != "vm/1/c-2" {
		t.Errorf("owner %q after the late release, want vm/1/c-2", st.Owner)
	}
	// Once a later release ended that hold, the retried release reports
	// only that its hold ended (2): released, or lapsed, it cannot tell.
	later := releaseArgs{id: "vm/1/c-2", token: lockStateOf(t, mr, k).Token, publish: "PUBLISH", mode: "release"}.call(k)
	if n, err := later.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Fatalf("the later release: %v, %v", n, err)
	}
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 2 {
		t.Errorf("the release retried after a later release: %v, %v; want 2", n, err)
	}
}

// A tombstone key of the wrong type does not fail a withdrawal, which
// would leave the ticket queued: the key is replaced, and the ticket is
// refused.
func TestTombstoneOfTheWrongTypeStillWithdraws(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const holder, ticket = "vm/1/c-1", "vm/1/c-2"
	if res, err := tombAcquire(holder, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != 1 {
		t.Fatalf("acquire: %v, %v", res, err)
	}
	res, err := tombAcquire(ticket, "queue").run(ctx, rdb).Int64Slice()
	if err != nil || res[0] != 0 || len(res) != 4 {
		t.Fatalf("queue: %v, %v", res, err)
	}
	if _, err := mr.Push(k.Tombstone(ticket), "x"); err != nil {
		t.Fatal(err)
	}
	withdraw := releaseArgs{id: ticket, record: tombRecord(ticket, res), publish: "PUBLISH", mode: "withdraw", refuse: true}.call(k)
	if n, err := withdraw.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Fatalf("withdraw: %v, %v; want 1", n, err)
	}
	if q := queuedTickets(t, mr, k); len(q) != 0 {
		t.Errorf("queue %q after the withdrawal, want empty", q)
	}
	if st := lockStateOf(t, mr, k); st.Queue != 0 {
		t.Errorf("queue count %d after the withdrawal, want 0", st.Queue)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl <= 0 || ttl > time.Hour {
		t.Errorf("tombstone TTL %v, want at most an hour", ttl)
	}
	if res, err := tombAcquire(ticket, "queue").run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the attempt: %v, %v; want {-2, 0}", res, err)
	}
}

// An attempt that finds its ticket gone from the queue (acquire.lua's
// {-3, 0}: its record was taken from the head, as by a release that
// dropped it as dead) writes nothing, and the call goes on under a new
// ticket; a late copy of the call's first attempt, still on its way,
// is refused once the call withdrew the old ticket with refusal.
func TestTombstoneLeftQueueAttemptThenWithdrawal(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const holder, ticket = "vm/1/c-1", "vm/1/c-2"
	if res, err := tombAcquire(holder, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != 1 {
		t.Fatalf("holder: %v, %v", res, err)
	}
	first := tombAcquire(ticket, "queue")
	res, err := first.run(ctx, rdb).Int64Slice()
	if err != nil || res[0] != 0 || len(res) != 4 {
		t.Fatalf("queue: %v, %v", res, err)
	}
	// A release dropped the ticket from the queue's head meanwhile (as
	// dead).
	if _, err := mr.Lpop(k.Queue); err != nil {
		t.Fatal(err)
	}
	mr.HSet(k.Hash, schema.QueueField, "0", schema.PoppedField, "1")
	again := acquireArgs{ticket: ticket, lease: time.Minute, mode: "again", seq: res[2], heartbeat: 3 * time.Second,
		handoff: 3 * time.Second, publish: "PUBLISH"}.call(k)
	before := mr.Dump()
	if res, err := again.run(ctx, rdb).Int64Slice(); err != nil || len(res) != 2 || res[0] != -3 {
		t.Fatalf("the next attempt: %v, %v; want {-3, 0}", res, err)
	}
	if after := mr.Dump(); after != before {
		t.Errorf("the attempt that found its ticket gone wrote:\n%s\nwant\n%s", after, before)
	}
	withdraw := releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw", refuse: true}.call(k)
	if n, err := withdraw.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Fatalf("withdraw: %v, %v", n, err)
	}
	if res, err := first.run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the first attempt: %v, %v; want {-2, 0}", res, err)
	}
	if q := queuedTickets(t, mr, k); len(q) != 0 {
		t.Errorf("queue %q, want empty: the late copy queued the withdrawn ticket", q)
	}
}

// A release of a ticket that no longer holds (its call was withdrawn,
// which gave the hold back) writes nothing: the withdrawal's tombstone
// keeps its hour, and a late copy of the acquire is still refused later.
func TestTombstoneReleaseAfterWithdrawalKeepsTheWithdrawal(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const ticket = "vm/1/c-1"
	res, err := tombAcquire(ticket, "barge").run(ctx, rdb).Int64Slice()
	if err != nil || res[0] != 1 {
		t.Fatalf("acquire: %v, %v", res, err)
	}
	withdraw := releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw", refuse: true}.call(k)
	if n, err := withdraw.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Fatalf("withdraw: %v, %v; want 1 (it gave the hold back)", n, err)
	}
	if st := lockStateOf(t, mr, k); st.Owner != "" {
		t.Fatalf("owner %q after the withdrawal, want the hold given back", st.Owner)
	}
	mr.FastForward(30 * time.Second)
	before := mr.Dump()
	release := releaseArgs{id: ticket, token: res[1], publish: "PUBLISH", mode: "release"}.call(k)
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 1 {
		// The token is still the last one issued: to the caller, the hold
		// was released (by the withdrawal).
		t.Fatalf("release after the withdrawal: %v, %v; want 1 (the token unchanged)", n, err)
	}
	if after := mr.Dump(); after != before {
		t.Errorf("the release after the withdrawal wrote:\n%s\nwant\n%s", after, before)
	}
	if v, _ := mr.Get(k.Tombstone(ticket)); v != "withdrawn" {
		t.Errorf("tombstone %q, want withdrawn", v)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != time.Hour-30*time.Second {
		t.Errorf("tombstone TTL %v, want the withdrawal's hour less 30 s", ttl)
	}
	mr.FastForward(20 * time.Minute)
	if res, err := tombAcquire(ticket, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the acquire: %v, %v; want {-2, 0}", res, err)
	}
}

// A copy of an acquire whose reply was lost (held up on a stalled
// connection) that arrives after the hold it took was released takes
// nothing: the release refuses the ticket. Taken, the lock would stay held
// for a whole lease after Unlock, for nobody.
func TestLateAcquireCopyAfterUnlockIsRefused(t *testing.T) {
	for _, late := range []time.Duration{0, time.Minute} {
		t.Run(late.String()+" late", func(t *testing.T) { testLateAcquireCopy(t, late) })
	}
}

// testLateAcquireCopy delivers the late copy late after the Unlock (the
// embedded Redis's clock and TTLs moved forward that much).
func testLateAcquireCopy(t *testing.T, late time.Duration) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	hook := &lostReplyThenRecord{}
	addHook(rdb, hook)
	c := newClient(t, rdb)
	m, other := must(c.NewMutex("l")), must(c.NewMutex("l"))
	if err := other.Lock(ctx); err != nil { // loads the script: EVALSHA finds it
		t.Fatal(err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := m.newCall("barge")
	hook.mu.Lock()
	hook.armed = true
	hook.mu.Unlock()
	if _, _, err := l.attempt(ctx); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("attempt: %v, want its lost reply", err)
	}
	if ok, _, err := l.attempt(ctx); !ok || err != nil {
		t.Fatalf("the attempt after the lost reply: %v, %v; want the lock the lost one took", ok, err)
	}
	hook.mu.Lock()
	lost := hook.lost
	hook.mu.Unlock()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mr.SetTime(time.Now().Add(late))
	mr.FastForward(late)
	res, err := rdb.Do(ctx, lost...).Int64Slice()
	if err != nil || res[0] != -2 {
		t.Fatalf("the late copy: %v, %v; want it refused", res, err)
	}
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after the holder's Unlock and the late copy: %v, %v; want the lock", ok, err)
	}
}
