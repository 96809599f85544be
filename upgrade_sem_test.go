package redisync

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// layout3Sem is the semaphore scripts of redisync v1.0.0 (layout 3, copied
// into testdata/semaphore-layout3), called as that version calls them: a
// process of it, during a rolling deploy.
type layout3Sem struct {
	acquire, release *luaScript
	keys             []string // in the order its acquire script takes them
}

func loadLayout3Sem(t *testing.T, k schema.Semaphore) layout3Sem {
	t.Helper()
	read := func(file string) string {
		b, err := os.ReadFile(filepath.Join("testdata", "semaphore-layout3", file))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	lib := read("lib.lua") + read("sem_lib.lua")
	b := k.Hash
	return layout3Sem{testScript(lib + read("sem_acquire.lua")), testScript(lib + read("sem_release.lua")),
		[]string{b, b + ":expiry", b + ":size", b + ":queue", b + ":waiters", b + ":withdrawn", b + ":released", b + ":token"}}
}

// tryAcquire runs layout 3's acquire for holder, a TryAcquire of n
// permits of a semaphore of size 2, and returns its reply code.
func (o layout3Sem) tryAcquire(rdb *redis.Client, holder string, n int64) (int64, error) {
	res, err := o.acquire.Run(ctx, rdb, o.keys, holder, n, 2, 0, 1, time.Minute.Milliseconds(), "try", holder+"#1", "0",
		1000, 1000, o.keys[0]+":ch", "PUBLISH", "0").Slice()
	if err != nil {
		return 0, err
	}
	return res[0].(int64), nil
}

// releaseAll runs layout 3's release of holder's n permits.
func (o layout3Sem) releaseAll(rdb *redis.Client, holder string, n int64) error {
	k := o.keys
	keys := []string{k[0], k[1], k[3], k[4], k[6], k[5], k[2], k[7]}
	return o.release.Run(ctx, rdb, keys, holder, n, n, 2, "release", "", time.Minute.Milliseconds(), 2,
		tombstoneTTL.Milliseconds(), k[0]+":ch", "PUBLISH", "0", "0").Err()
}

// TestUpgradeSemaphoreFromLayout3: a process of v1.0.0 (layout 3) and one
// of this version (layout 5) never both hold permits of one semaphore,
// whichever came first: each fails with a LAYOUT error on the other's
// state, having written nothing (v1.0.0 as long as this version's state
// lives, an hour past its last use, even where v1.0.0's own size key
// lives on; this version while one of v1.0.0's leases runs), and this
// version takes over a semaphore that v1.0.0 left idle.
func TestUpgradeSemaphoreFromLayout3(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb)
	k := schema.SemaphoreKeys(schema.DefaultPrefix, "up")
	old := loadLayout3Sem(t, k)
	all := append([]string{k.Ended}, old.keys...)
	clear := func() { rdb.Del(context.Background(), all...) }
	refusedByOld := func(what, holder string) {
		t.Helper()
		before := semDump(t, rdb, all)
		if got, err := old.tryAcquire(rdb, holder, 1); err == nil || !strings.Contains(err.Error(), "redisync") {
			t.Fatalf("v1.0.0's acquire %s: %v, %v; want its error", what, got, err)
		}
		if after := semDump(t, rdb, all); after != before {
			t.Fatalf("v1.0.0's refused acquire %s wrote:\n%s\nwant\n%s", what, after, before)
		}
	}

	t.Run("this version first", func(t *testing.T) {
		clear()
		s := must(c.NewSemaphore("up", 2))
		if err := s.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		refusedByOld("beside this version's holder", "old/c1-1")
		if err := s.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		refusedByOld("on the semaphore this version left idle", "old/c1-2")
	})

	t.Run("v1.0.0 first", func(t *testing.T) {
		clear()
		if got, err := old.tryAcquire(rdb, "old/c1-1", 2); got != 1 || err != nil {
			t.Fatalf("v1.0.0's acquire: %v, %v", got, err)
		}
		before := semDump(t, rdb, all)
		s := must(c.NewSemaphore("up", 2))
		if ok, err := s.TryAcquire(ctx, 1); ok || !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "layout 3") {
			t.Fatalf("TryAcquire beside v1.0.0's holder: %v, %v; want ErrLayout naming layout 3", ok, err)
		}
		if after := semDump(t, rdb, all); after != before {
			t.Fatalf("the refused TryAcquire wrote:\n%s\nwant\n%s", after, before)
		}
		// Left idle by v1.0.0 (its size key lives on): this version takes
		// it over, and v1.0.0 is refused from then on.
		if err := old.releaseAll(rdb, "old/c1-1", 2); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.TryAcquire(ctx, 2); !ok || err != nil {
			t.Fatalf("TryAcquire of the semaphore v1.0.0 left idle: %v, %v", ok, err)
		}
		if v := rdb.HGet(ctx, k.Hash, "{size}").Val(); v != "2:"+strconv.Itoa(schema.SemLayout) {
			t.Fatalf("size record %q after the takeover", v)
		}
		if rdb.Exists(ctx, k.Hash+":size").Val() != 1 {
			t.Fatal("v1.0.0's size key is gone: the case this covers is not reached")
		}
		refusedByOld("with its size key there", "old/c1-2")
		if err := s.Release(ctx, 2); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("this version's first write is a withdrawal", func(t *testing.T) {
		clear()
		if got, err := old.tryAcquire(rdb, "old/c1-1", 1); got != 1 || err != nil {
			t.Fatalf("v1.0.0's acquire: %v, %v", got, err)
		}
		if err := old.releaseAll(rdb, "old/c1-1", 1); err != nil {
			t.Fatal(err)
		}
		// A call that may have run gives up: it withdraws its waiter id,
		// which writes the hash.
		withdraw := semReleaseArgs{holder: "new/c2-1", n: 1, seq: 1, mode: "withdraw", waiter: "new/c2-1#1",
			lease: time.Minute, size: 2, publish: "PUBLISH"}
		if err := withdraw.call(k).run(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
		refusedByOld("after this version's withdrawal", "old/c1-2")
	})
}

// semDump returns the values of the keys as text (not their TTLs, which
// run down).
func semDump(t *testing.T, rdb *redis.Client, keys []string) string {
	t.Helper()
	var b strings.Builder
	for _, key := range keys {
		switch typ := rdb.Type(ctx, key).Val(); typ {
		case "hash":
			fmt.Fprintf(&b, "%s %v\n", key, rdb.HGetAll(ctx, key).Val())
		case "zset":
			fmt.Fprintf(&b, "%s %v\n", key, rdb.ZRangeWithScores(ctx, key, 0, -1).Val())
		case "string":
			fmt.Fprintf(&b, "%s %s\n", key, rdb.Get(ctx, key).Val())
		}
	}
	return b.String()
}
