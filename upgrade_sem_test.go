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

// layout3Sem is the previous version's semaphore scripts (layout 3, copied
// into testdata/semaphore-layout3), called with the arguments this
// version's callers build: a process of that version, during a rolling
// deploy.
type layout3Sem struct{ acquire, release *luaScript }

func loadLayout3Sem(t *testing.T) layout3Sem {
	t.Helper()
	read := func(file string) string {
		b, err := os.ReadFile(filepath.Join("testdata", "semaphore-layout3", file))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	lib := read("lib.lua") + read("sem_lib.lua")
	return layout3Sem{testScript(lib + read("sem_acquire.lua")), testScript(lib + read("sem_release.lua"))}
}

// TestUpgradeSemaphoreLayout3To4: a process of the previous version
// (layout 3) and one of this version (layout 4) never both hold permits
// of one semaphore, whichever came first; each fails with a LAYOUT error
// on the other's state, having written nothing, and takes over a
// semaphore that the other left idle (this version's state stays an hour
// after its last use: the old version waits for it to run out).
func TestUpgradeSemaphoreLayout3To4(t *testing.T) {
	rdb := redistest.Client(t)
	old := loadLayout3Sem(t)
	c := newClient(t, rdb)
	k := schema.SemaphoreKeys(schema.DefaultPrefix, "up")
	clear := func() {
		rdb.Del(context.Background(), k.Holders, k.Expiry, k.Size, k.Queue, k.Waiters, k.Released, k.Withdrawn)
	}
	oldAcquire := func(holder string, n int64) (any, error) {
		call := semAcquireArgs{holder: holder, n: n, size: 2, seq: 1, lease: time.Minute, mode: "try", waiter: holder + "#1",
			heartbeat: time.Second, grant: time.Second, publish: "PUBLISH"}.call(k)
		call.script = old.acquire
		return call.run(ctx, rdb).Result()
	}
	oldRelease := func(holder string, n int64) error {
		call := semReleaseArgs{holder: holder, n: n, held: n, seq: 2, mode: "release", lease: time.Minute, size: 2, publish: "PUBLISH"}.call(k)
		call.script = old.release
		return call.run(ctx, rdb).Err()
	}
	wantLayoutError := func(what string, err error, found int) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "LAYOUT") || !strings.Contains(err.Error(), "layout "+strconv.Itoa(found)) {
			t.Fatalf("%s: %v, want a LAYOUT error naming layout %d", what, err, found)
		}
	}

	t.Run("this version holds", func(t *testing.T) {
		clear()
		s := must(c.NewSemaphore("up", 2))
		if err := s.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		before := semDump(t, rdb, k)
		_, err := oldAcquire("old/c1-1", 1)
		wantLayoutError("the old version's acquire", err, schema.SemLayout)
		if after := semDump(t, rdb, k); after != before {
			t.Fatalf("the refused acquire wrote:\n%s\nwant\n%s", after, before)
		}
		if err := s.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		// Idle now, but its state lives on: the old version still refuses.
		_, err = oldAcquire("old/c1-2", 1)
		wantLayoutError("the old version's acquire on the idle semaphore", err, schema.SemLayout)
	})

	t.Run("the old version holds", func(t *testing.T) {
		clear()
		if res, err := oldAcquire("old/c1-1", 2); err != nil || !strings.HasPrefix(fmt.Sprint(res), "[1 ") {
			t.Fatalf("the old version's acquire: %v, %v", res, err)
		}
		before := semDump(t, rdb, k)
		ok, err := must(c.NewSemaphore("up", 2)).TryAcquire(ctx, 1)
		if ok || !errors.Is(err, ErrLayout) {
			t.Fatalf("TryAcquire beside the old version's holder: %v, %v; want ErrLayout", ok, err)
		}
		if after := semDump(t, rdb, k); after != before {
			t.Fatalf("the refused TryAcquire wrote:\n%s\nwant\n%s", after, before)
		}
		// Left idle by the old version: this one takes it over.
		if err := oldRelease("old/c1-1", 2); err != nil {
			t.Fatal(err)
		}
		s := must(c.NewSemaphore("up", 2))
		if ok, err := s.TryAcquire(ctx, 2); !ok || err != nil {
			t.Fatalf("TryAcquire of the idle semaphore: %v, %v", ok, err)
		}
		if v := rdb.Get(ctx, k.Size).Val(); v != "2:"+strconv.Itoa(schema.SemLayout) {
			t.Fatalf("size record %q after the takeover", v)
		}
		if err := s.Release(ctx, 2); err != nil {
			t.Fatal(err)
		}
	})
}

// semDump returns the values of the semaphore's keys k as text (not
// their TTLs, which run down).
func semDump(t *testing.T, rdb *redis.Client, k schema.Semaphore) string {
	t.Helper()
	var b strings.Builder
	for _, key := range []string{k.Holders, k.Expiry, k.Size, k.Queue, k.Waiters, k.Released, k.Withdrawn} {
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
