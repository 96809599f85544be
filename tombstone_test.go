package redisync

import (
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// A lock's ticket has one tombstone (scripts/lib.lua, ended), written when
// its hold is released or its call withdrawn: every script that can take
// a hold under the ticket refuses it once the tombstone exists.

// tombAcquire returns an attempt of ticket, in mode, on the lock "tomb".
func tombAcquire(ticket, mode string) scriptCall {
	return acquireArgs{ticket: ticket, lease: time.Minute, mode: mode, heartbeat: 3 * time.Second,
		handoff: 3 * time.Second, publish: "PUBLISH"}.call(schema.LockKeys("redisync", "tomb"))
}

// A late copy of any attempt of a withdrawn call takes nothing: not the
// free lock (barging, fair, try, or a MultiMutex's), and not its place in
// the queue.
func TestTombstoneWithdrawnTicketTakesNothing(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const ticket = "vm/1/c-1"
	if res, err := (releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw"}).call(k).run(ctx, rdb).Int64(); err != nil || res != 0 {
		t.Fatalf("withdraw: %v, %v; want 0 (held nothing)", res, err)
	}
	if v, _ := mr.Get(k.Tombstone(ticket)); v != "withdrawn" {
		t.Fatalf("tombstone %q, want withdrawn", v)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != 2*time.Minute {
		t.Fatalf("tombstone TTL %v, want 2 min", ttl)
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
	if keys := mr.Keys(); len(keys) != 1 || keys[0] != k.Tombstone(ticket) {
		t.Errorf("keys %q, want only the tombstone", keys)
	}
}

// A withdrawal that follows the hold's release (a late reply of an
// abandoned attempt withdraws its ticket while Unlock is retried) keeps
// the release's token: the retried release reports success. The
// tombstone then lives as long as a withdrawal's.
func TestTombstoneWithdrawalKeepsTheReleaseToken(t *testing.T) {
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
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != tombstoneTTL {
		t.Fatalf("release tombstone TTL %v, want %v", ttl, tombstoneTTL)
	}
	withdraw := releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw"}.call(k)
	if n, err := withdraw.run(ctx, rdb).Int64(); err != nil || n != 0 {
		t.Fatalf("withdraw: %v, %v; want 0", n, err)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl != 2*time.Minute {
		t.Errorf("tombstone TTL %v after the withdrawal, want 2 min", ttl)
	}
	if n, err := release.run(ctx, rdb).Int64(); err != nil || n != 1 {
		t.Errorf("the retried release: %v, %v; want 1 (applied)", n, err)
	}
	if res, err := tombAcquire(ticket, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the acquire: %v, %v; want {-2, 0}", res, err)
	}
}

// A tombstone key of the wrong type does not fail a withdrawal, which
// would leave the ticket queued: the key gets a TTL, and the ticket is
// refused.
func TestTombstoneOfTheWrongTypeStillWithdraws(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "tomb")
	const holder, ticket = "vm/1/c-1", "vm/1/c-2"
	if res, err := tombAcquire(holder, "barge").run(ctx, rdb).Int64Slice(); err != nil || res[0] != 1 {
		t.Fatalf("acquire: %v, %v", res, err)
	}
	if res, err := tombAcquire(ticket, "queue").run(ctx, rdb).Int64Slice(); err != nil || res[0] != 0 {
		t.Fatalf("queue: %v, %v", res, err)
	}
	if _, err := mr.Push(k.Tombstone(ticket), "x"); err != nil {
		t.Fatal(err)
	}
	withdraw := releaseArgs{id: ticket, publish: "PUBLISH", mode: "withdraw"}.call(k)
	if n, err := withdraw.run(ctx, rdb).Int64(); err != nil || n != 0 {
		t.Fatalf("withdraw: %v, %v; want 0", n, err)
	}
	if q, _ := mr.ZMembers(k.Queue); len(q) != 0 {
		t.Errorf("queue %q after the withdrawal, want empty", q)
	}
	if ttl := mr.TTL(k.Tombstone(ticket)); ttl <= 0 || ttl > 2*time.Minute {
		t.Errorf("tombstone TTL %v, want at most 2 min", ttl)
	}
	if res, err := tombAcquire(ticket, "queue").run(ctx, rdb).Int64Slice(); err != nil || res[0] != -2 {
		t.Errorf("a late copy of the attempt: %v, %v; want {-2, 0}", res, err)
	}
}
