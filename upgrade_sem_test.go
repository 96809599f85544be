package redisync

import (
	"context"
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
// of this version (layout 5) keep a semaphore's holders in the same
// records and count, so that between them they never hold more permits
// than its size, whichever came first. v1.0.0 refuses (LAYOUT) a
// semaphore that this version left idle (its state lives an hour after
// its last use) unless v1.0.0 used it in the last hour; this version takes
// over one that v1.0.0 left idle.
func TestUpgradeSemaphoreFromLayout3(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb)
	k := schema.SemaphoreKeys(schema.DefaultPrefix, "up")
	old := loadLayout3Sem(t, k)
	clear := func() {
		rdb.Del(context.Background(), append([]string{k.Ended}, old.keys...)...)
	}
	used := func() string { return rdb.HGet(ctx, k.Hash, schema.SemUsedField).Val() }

	t.Run("this version holds first", func(t *testing.T) {
		clear()
		s := must(c.NewSemaphore("up", 2))
		if err := s.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		// Idle now, but its state lives on: v1.0.0, which has not used it,
		// refuses it.
		before := semDump(t, rdb, append([]string{k.Ended}, old.keys...))
		if _, err := old.tryAcquire(rdb, "old/c1-1", 1); err == nil || !strings.Contains(err.Error(), "LAYOUT") {
			t.Fatalf("v1.0.0's acquire on the idle semaphore: %v, want a LAYOUT error", err)
		}
		if after := semDump(t, rdb, append([]string{k.Ended}, old.keys...)); after != before {
			t.Fatalf("the refused acquire wrote:\n%s\nwant\n%s", after, before)
		}
		// In use: v1.0.0 counts this version's permits as its own.
		if err := s.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if got, err := old.tryAcquire(rdb, "old/c1-2", 2); got != 0 || err != nil {
			t.Fatalf("v1.0.0's TryAcquire(2) beside 1 of 2 permits held: %v, %v; want 0 (not granted)", got, err)
		}
		if got, err := old.tryAcquire(rdb, "old/c1-3", 1); got != 1 || err != nil {
			t.Fatalf("v1.0.0's TryAcquire(1) beside 1 of 2 permits held: %v, %v; want 1 (granted)", got, err)
		}
		if ok, err := must(c.NewSemaphore("up", 2)).TryAcquire(ctx, 1); ok || err != nil {
			t.Fatalf("TryAcquire with both permits held, one by each version: %v, %v; want false", ok, err)
		}
		if u := used(); u != "2" {
			t.Fatalf("permits in use %q, want 2", u)
		}
		if err := old.releaseAll(rdb, "old/c1-3", 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if u := used(); u != "" {
			t.Fatalf("permits in use %q after both released", u)
		}
	})

	t.Run("v1.0.0 holds first", func(t *testing.T) {
		clear()
		if got, err := old.tryAcquire(rdb, "old/c1-1", 2); got != 1 || err != nil {
			t.Fatalf("v1.0.0's acquire: %v, %v", got, err)
		}
		s := must(c.NewSemaphore("up", 2))
		if ok, err := s.TryAcquire(ctx, 1); ok || err != nil {
			t.Fatalf("TryAcquire beside v1.0.0's holder of both permits: %v, %v; want false", ok, err)
		}
		if err := old.releaseAll(rdb, "old/c1-1", 2); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.TryAcquire(ctx, 2); !ok || err != nil {
			t.Fatalf("TryAcquire of the semaphore v1.0.0 left idle: %v, %v", ok, err)
		}
		if v := rdb.HGet(ctx, k.Hash, "{size}").Val(); v != "2:"+strconv.Itoa(schema.SemLayout) {
			t.Fatalf("size record %q after the takeover", v)
		}
		if got, err := old.tryAcquire(rdb, "old/c1-2", 1); got == 1 || (err == nil && got != 0) {
			t.Fatalf("v1.0.0's TryAcquire beside this version's holder of both permits: %v, %v; want refused", got, err)
		}
		if err := s.Release(ctx, 2); err != nil {
			t.Fatal(err)
		}
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
