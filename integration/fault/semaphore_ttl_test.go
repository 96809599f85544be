package fault

import (
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// A partial Semaphore.Release must keep the semaphore's keys
// alive for the holder's re-armed lease, or the permits are over-granted.
func TestSemaphorePartialReleaseKeepsTTL(t *testing.T) {
	const lease = time.Second
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	a := must(newClient(t, addr).NewSemaphore(name, 3, redisync.WithFixedLease(lease)))
	b := must(newClient(t, addr).NewSemaphore(name, 3, redisync.WithFixedLease(lease)))

	if err := a.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	// Half of A's lease passes before A gives one permit back (a
	// deliberate pause: the release must re-arm the lease from then).
	time.Sleep(lease / 2)
	released := time.Now()
	if err := a.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	lost := a.Lost()
	t.Cleanup(func() { _ = a.Release(ctx, a.Held()) })

	pttl := rdb.PTTL(ctx, semKey(name)).Val()
	exp := rdb.ZRangeWithScores(ctx, semKey(name)+":expiry", 0, -1).Val()
	now := serverMs(t, rdb)
	for _, z := range exp {
		t.Logf("after the partial release: holders key PTTL %v, holder's recorded expiry in %v",
			pttl, time.Duration(int64(z.Score)-now)*time.Millisecond)
	}

	// A holds 2 of 3 permits, leased until lease after the release: B may
	// not get 2 permits before then. Look until 80% of that lease.
	end := released.Add(lease * 8 / 10)
	for time.Now().Before(end) {
		ok, err := b.TryAcquire(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			at := time.Since(released)
			_ = b.Release(ctx, 2)
			t.Fatalf("over-grant: B got 2 permits %v after A's partial release, while A still holds %d of 3 "+
				"(lease %v re-armed by the release; A's Lost closed: %v): the keys' TTL was not extended with the expiry entry",
				at.Round(time.Millisecond), a.Held(), lease, isClosed(lost))
		}
		time.Sleep(2 * time.Millisecond) // poll interval
	}
	if isClosed(lost) {
		t.Fatalf("A's Lost closed within 80%% of the lease re-armed by its partial release")
	}
}
