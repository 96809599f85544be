package main

import (
	"context"
	"testing"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// Review 6: "sem --resize M takes a size M >= 1 and no command", but the
// check is *resize < 0 || (*resize > 0 && argv != nil): --resize 0 passes
// it and is then ignored (the resize branch runs only for *resize > 0),
// so "sem --limit 2 --resize 0 NAME -- CMD" takes a permit and runs CMD
// instead of failing with a usage error (a typo in a resize runs the
// job, or holds a permit until signalled when no CMD is given).
func TestReview6SemResizeZeroIsNotAUsageError(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	if code, p := runCode(t, addr, "sem", "--limit", "2", "--resize", "0", name, "--", "true"); code != exitUsage {
		t.Fatalf("sem --resize 0 with a command: exit %d, want %d (usage); stdout %q, stderr %q",
			code, exitUsage, p.stdout.String(), p.stderr.String())
	}
}

// Review 6: status counts "the processes with waiters, plain or fair" as
// the subscribers of the lock's channel, but a Client keeps a channel
// subscribed for 2 s (lingerFor) after its last waiter left. A process
// whose waiter has just been granted the lock (the holder, nobody
// waiting) is counted as a waiting process, and status prints
// "1 process(es) with waiters".
func TestReview6StatusCountsTheNewHolderAsWaiting(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	name := uniqueName(t)
	ca, cb := redisync.New(rdb), redisync.New(rdb)
	t.Cleanup(func() { _ = ca.Close(); _ = cb.Close() })
	a, b := ca.NewMutex(name), cb.NewMutex(name)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	keys := newLockKeys("redisync", name)
	done := make(chan error, 1)
	go func() { done <- b.Lock(ctx) }()
	waitFor(t, "b to wait", func() bool {
		return rdb.PubSubNumSub(ctx, keys.channel).Val()[keys.channel] == 1
	})
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Unlock(ctx) }()
	st, err := readStatus(ctx, rdb, "redisync", name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lock.WaitingProcesses != 0 {
		t.Fatalf("status counts %d process(es) with waiters; nobody waits (b holds the lock, queue %v)",
			st.Lock.WaitingProcesses, st.Lock.Queue)
	}
}
