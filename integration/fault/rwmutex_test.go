package fault

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// rwKey is the holders hash of the read-write lock name.
func rwKey(name string) string { return "redisync:rw:{" + name + "}" }

// TestRWMutexFIFOAcrossProcesses queues readers and writers, each a
// process of its own, behind a writer, in the order R R W R W W R R, and
// checks that they hold the lock in exactly that order: each run of
// readers together, each writer alone, and nobody before its turn (Redis
// counts exactly the group as holders, the rest still queued).
func TestRWMutexFIFOAcrossProcesses(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	first := startHolder(t, "serve", "-addr", addr, "-name", name)
	first.send("wlock")
	first.expect("wlocked ", 5*time.Second)

	const order = "RRWRWWRR"
	procs := make([]*proc, len(order))
	for i, kind := range order {
		procs[i] = startHolder(t, "serve", "-addr", addr, "-name", name)
		if kind == 'W' {
			procs[i].send("wlock")
		} else {
			procs[i].send("rlock")
		}
		eventually(t, 10*time.Second, "the waiter to queue", func() bool {
			return rdb.ZCard(ctx, rwKey(name)+":queue").Val() == int64(i+1)
		})
	}
	first.send("wunlock")
	first.expect("wunlocked", 5*time.Second)
	var lastToken int64
	for i := 0; i < len(order); {
		j := i + 1
		for order[i] == 'R' && j < len(order) && order[j] == 'R' {
			j++
		}
		for k := i; k < j; k++ {
			if order[k] == 'W' {
				l, _ := procs[k].expect("wlocked ", 10*time.Second)
				tok, err := atoi64(l[len("wlocked "):])
				if err != nil || tok <= lastToken {
					t.Fatalf("waiter %d: %q after token %d", k, l, lastToken)
				}
				lastToken = tok
			} else {
				procs[k].expect("rlocked", 10*time.Second)
			}
		}
		if n := len(slices.DeleteFunc(rdb.HKeys(ctx, rwKey(name)).Val(), func(f string) bool { return !schema.SemHolderField(f) })); n != j-i {
			t.Fatalf("group %d..%d: %d holders in Redis, want %d", i, j-1, n, j-i)
		}
		if n := rdb.ZCard(ctx, rwKey(name)+":queue").Val(); n != int64(len(order)-j) {
			t.Fatalf("group %d..%d: %d still queued, want %d", i, j-1, n, len(order)-j)
		}
		for k := i; k < j; k++ {
			if order[k] == 'W' {
				procs[k].send("wunlock")
				procs[k].expect("wunlocked", 5*time.Second)
			} else {
				procs[k].send("runlock")
				procs[k].expect("runlocked", 5*time.Second)
			}
		}
		i = j
	}
}

// TestRWMutexReaderSIGKILL: a reader process killed while it reads, with
// other readers coming and going, keeps a writer out no longer than its
// own lease: its share has a lease of its own, not the readers' common
// one.
func TestRWMutexReaderSIGKILL(t *testing.T) {
	const lease = time.Second
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	reader := startHolder(t, "serve", "-addr", addr, "-name", name, "-watchdog", lease.String())
	reader.send("rlock")
	reader.expect("rlocked", 5*time.Second)

	c := newClient(t, addr)
	other := must(c.NewRWMutex(name)) // a live reader under the default 15 s lease
	if err := other.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	writer := must(c.NewRWMutex(name))
	done := make(chan error, 1)
	go func() { done <- writer.Lock(ctx) }()
	rdb := redistest.NewClient(t, addr)
	eventually(t, 5*time.Second, "the writer to queue", func() bool {
		return rdb.ZCard(ctx, rwKey(name)+":queue").Val() == 1
	})
	killed := time.Now()
	reader.kill()
	if err := other.RUnlock(ctx); err != nil { // the live reader leaves
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(lease + 5*time.Second):
		t.Fatal("the writer never got in past the dead reader")
	}
	gap := time.Since(killed)
	t.Logf("SIGKILL of a reader to the writer in: %v (lease %v)", gap.Round(time.Millisecond), lease)
	if gap > lease+300*time.Millisecond {
		t.Fatalf("the writer got in %v after the reader died, want <= lease + 300ms", gap)
	}
	if err := writer.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}
