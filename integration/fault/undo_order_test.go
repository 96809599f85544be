package fault

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// The undo of a call whose reply was lost
// goes out on another connection and can reach Redis before the call
// itself (held on the wire, as behind a retransmission). Were the late
// acquire to take the lock for a call that had returned an error, the
// hold would be nobody's, kept for its whole lease (30 s): the undo marks
// the call's ticket withdrawn, and the late acquire takes nothing.
func TestUndoOvertakingTheAcquireLeavesNoHold(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	px := redistest.NewProxy(t, addr)
	name := redistest.Name(t)
	key := lockKey(name)

	// go-redis gives up on a reply after 200 ms, closes the connection and
	// leaves the call's outcome unknown.
	a, err := redisync.New(redis.NewClient(&redis.Options{Addr: px.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	m := must(a.NewMutex(name))
	// Load the scripts, so that the held request is the acquire itself.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	held, release := px.HoldNext(strings.ToLower(key))
	defer release()
	lctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	done := lockAsync(m, lctx)
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the acquire was not sent")
	}
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatal("Lock returned nil while its acquire was held on the wire")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not return by its deadline")
	}
	// The undo, sent once go-redis gave up on the reply, reaches Redis on
	// a new connection while the acquire is still held.
	eventually(t, 5*time.Second, "the undo to reach Redis", func() bool {
		withdrawn := 0
		for _, k := range rdb.Keys(ctx, key+":released:*").Val() {
			if rdb.Get(ctx, k).Val() == "withdrawn" {
				withdrawn++
			}
		}
		return withdrawn == 1
	})
	release() // the acquire arrives late
	eventually(t, 5*time.Second, "the late acquire to reach Redis", func() bool {
		return time.Since(px.LastRead(true)) > 100*time.Millisecond
	})
	if heldOn(t, rdb, key) {
		t.Fatalf("the late acquire took the lock for a call that had returned an error: %v", rdb.HGetAll(ctx, key).Val())
	}
	b := must(newClient(t, addr).NewMutex(name))
	if ok, err := b.TryLock(ctx); !ok || err != nil {
		t.Fatalf("another Client's TryLock of the free lock: %v, %v", ok, err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
