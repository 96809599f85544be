package redisync

import (
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// Review 22 (the tombstone that records a withdrawal). Tests that close
// gaps found by mutating the change: each fails when the line it names is
// taken out.

// An attempt that finds its ticket gone from the queue (acquire.lua's
// {-3, 0}) withdraws the ticket itself: a late copy of the call's first
// attempt, still on its way (a stalled connection, go-redis's retry),
// must then neither queue the ticket again nor take the lock. Without
// acquire.lua's withdraw_ticket in that branch every other test passes;
// the ghost place it leaves would be kept alive by its Client's
// heartbeat and handed the lock, held for nobody for a hand-off lease.
func TestReview22LeftQueueAttemptWithdrawsTheTicket(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const holder, ticket = "vm/1/c-1", "vm/1/c-2"
	if res, err := tombAcquire(holder, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != 1 {
		t.Fatalf("holder: %v, %v", res, err)
	}
	first := tombAcquire(ticket, "queue")
	if res, err := first.run(ctx, rdb).Int64Slice(); err != nil || res[0] != 0 {
		t.Fatalf("queue: %v, %v", res, err)
	}
	// A release dropped the ticket from the queue meanwhile (as dead).
	mr.ZRem(k.Queue, ticket)
	mr.HDel(k.Waiters, ticket)
	again := acquireArgs{ticket: ticket, lease: time.Minute, mode: "queue", heartbeat: 3 * time.Second,
		handoff: 3 * time.Second, publish: "PUBLISH", queued: true}.call(k)
	if res, err := again.run(ctx, rdb).Int64Slice(); err != nil || len(res) != 2 || res[0] != -3 {
		t.Fatalf("the next attempt: %v, %v; want {-3, 0}", res, err)
	}
	if v, _ := mr.Get(k.Tombstone(ticket)); v != "withdrawn" {
		t.Fatalf("tombstone %q after {-3, 0}, want withdrawn", v)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != 2*time.Minute {
		t.Errorf("tombstone TTL %v, want 2 min", ttl)
	}
	if res, err := first.run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the first attempt: %v, %v; want {-2, 0}", res, err)
	}
	if q, _ := mr.ZMembers(k.Queue); len(q) != 0 {
		t.Errorf("queue %q, want empty: the late copy queued the withdrawn ticket", q)
	}
}

// A release of a ticket that no longer holds (its call was withdrawn,
// which gave the hold back) reads the tombstone and writes nothing: the
// withdrawal's tombstone keeps its 2 minutes. (release_hold's SET, which
// would cut it to 10 s, runs only for a ticket that holds, and a withdrawn
// ticket never holds again while its tombstone lives.)
func TestReview22ReleaseAfterWithdrawalKeepsTheWithdrawal(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const ticket = "vm/1/c-1"
	res, err := tombAcquire(ticket, "barge").run(ctx, rdb).Int64Slice()
	if err != nil || res[0] != 1 {
		t.Fatalf("acquire: %v, %v", res, err)
	}
	withdraw := releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw"}.call(k)
	if n, err := withdraw.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Fatalf("withdraw: %v, %v; want 1 (it gave the hold back)", n, err)
	}
	mr.FastForward(30 * time.Second)
	release := releaseArgs{id: ticket, token: res[1], publish: "PUBLISH", mode: "release"}.call(k)
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 0 {
		t.Fatalf("release after the withdrawal: %v, %v; want 0 (not held)", n, err)
	}
	if v, _ := mr.Get(k.Tombstone(ticket)); v != "withdrawn" {
		t.Errorf("tombstone %q, want withdrawn", v)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != 90*time.Second {
		t.Errorf("tombstone TTL %v, want the withdrawal's 90 s left", ttl)
	}
	// 20 s on, past a release tombstone's 10 s, a late copy of the
	// acquire is still refused.
	mr.FastForward(20 * time.Second)
	if res, err := tombAcquire(ticket, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the acquire: %v, %v; want {-2, 0}", res, err)
	}
}
