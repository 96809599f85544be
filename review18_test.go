package redisync

import (
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/schema"
)

// Review 18 (ac5b0c9): the semaphore scripts dropped reads made only to
// check a key's type, counting on a later read before any write. These
// tests put a write in front of that later read (something for the script
// to prune or store first), so that a read taken out, or moved after a
// write, shows as a failed script that wrote.

// review18Sem returns a semaphore of size 3 whose holder "A" holds all 3
// permits and whose waiter "B#1" is queued for 1, set up by the scripts
// themselves.
func review18Sem(t *testing.T) (*miniredis.Miniredis, *redis.Client, schema.Semaphore) {
	t.Helper()
	mr, rdb, _ := newMini(t)
	k := schema.SemaphoreKeys("redisync", "s")
	for _, a := range []semAcquireArgs{
		{holder: "A", n: 3, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "A#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		{holder: "B", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "B#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
	} {
		if err := a.call(k).run(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := rdb.ZCard(ctx, k.Queue).Result(); n != 1 {
		t.Fatalf("queue of %d, want B#1 alone", n)
	}
	return mr, rdb, k
}

// review18Wrong replaces key by a list (with a TTL, as redisync's keys
// have) and adds a remembered release whose time is over: the script's
// prune of the released zset is then a real write.
func review18Wrong(t *testing.T, mr *miniredis.Miniredis, k schema.Semaphore, key string) {
	t.Helper()
	if _, err := mr.ZAdd(k.Released, 1, "old:1"); err != nil {
		t.Fatal(err)
	}
	mr.SetTTL(k.Released, time.Minute)
	mr.Del(key)
	mr.Lpush(key, "x")
	mr.SetTTL(key, time.Minute)
}

// A release (partial, granting the queue's head) or a withdrawal that
// meets a key of the wrong type fails having written nothing, even when it
// has a stale entry of the released zset to prune: the prune must follow
// every read (the expiry zset's is sem_reclaim's; the withdrawn zset's is
// made in withdraw mode only).
func TestReview18ReleaseWithAPruneMeetingWrongTypeWritesNothing(t *testing.T) {
	for _, mode := range []string{"release", "withdraw"} {
		for _, suffix := range []string{":expiry", ":queue", ":waiters", ":withdrawn"} {
			t.Run(mode+suffix, func(t *testing.T) {
				mr, rdb, k := review18Sem(t)
				review18Wrong(t, mr, k, semKey+suffix)
				before := mr.Dump()
				rel := semReleaseArgs{holder: "A", n: 1, held: 3, seq: 2, mode: "release", lease: time.Minute, size: 3, publish: "PUBLISH"}
				if mode == "withdraw" {
					rel = semReleaseArgs{holder: "B", n: 1, held: 0, seq: 2, mode: "withdraw", waiter: "B#1", lease: time.Minute, size: 3, publish: "PUBLISH"}
				}
				err := rel.call(k).run(ctx, rdb).Err()
				if suffix == ":withdrawn" && mode == "release" {
					// A release does not touch the withdrawn calls.
					if err != nil {
						t.Fatalf("release: %v, want success", err)
					}
					return
				}
				if err == nil || !errors.Is(redisError(err), ErrWrongType) {
					t.Fatalf("%s: %v, want a WRONGTYPE error", mode, err)
				}
				if after := mr.Dump(); after != before {
					t.Fatalf("the failed %s wrote:\nbefore:\n%s\nafter:\n%s", mode, before, after)
				}
			})
		}
	}
}

// A holder record that redisync did not write fails every script before
// it writes anything: ac5b0c9 dropped the acquire's parse of the caller's
// own record, counting on sem_used (every record) before sem_reclaim, the
// first write. The semaphore here has an ended lease to reclaim and a
// remembered release to prune, so that a check made after either shows.
func TestReview18JunkHolderRecordFailsBeforeAnyWrite(t *testing.T) {
	calls := map[string]func(k schema.Semaphore) scriptCall{
		"acquire try": func(k schema.Semaphore) scriptCall {
			return semAcquireArgs{holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "try", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"}.call(k)
		},
		"acquire queue": func(k schema.Semaphore) scriptCall {
			return semAcquireArgs{holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"}.call(k)
		},
		"release": func(k schema.Semaphore) scriptCall {
			return semReleaseArgs{holder: "A", n: 1, held: 3, seq: 2, mode: "release", lease: time.Minute, size: 3, publish: "PUBLISH"}.call(k)
		},
		"withdraw": func(k schema.Semaphore) scriptCall {
			return semReleaseArgs{holder: "B", n: 1, held: 0, seq: 2, mode: "withdraw", waiter: "B#1", lease: time.Minute, size: 3, publish: "PUBLISH"}.call(k)
		},
	}
	for name, call := range calls {
		for _, junk := range []string{"C", "Z"} { // the caller's own record, another's
			t.Run(name+"/"+junk, func(t *testing.T) {
				mr, rdb, k := review18Sem(t)
				if _, err := mr.ZAdd(k.Released, 1, "old:1"); err != nil {
					t.Fatal(err)
				}
				mr.SetTTL(k.Released, time.Minute)
				mr.HSet(k.Holders, "E", "1:1", junk, "junk")
				if _, err := mr.ZAdd(k.Expiry, 1, "E"); err != nil { // an ended lease
					t.Fatal(err)
				}
				before := mr.Dump()
				err := call(k).run(ctx, rdb).Err()
				if err == nil || !errors.Is(redisError(err), ErrWrongType) {
					t.Fatalf("%s: %v, want a WRONGTYPE error", name, err)
				}
				if after := mr.Dump(); after != before {
					t.Fatalf("the failed %s wrote:\nbefore:\n%s\nafter:\n%s", name, before, after)
				}
			})
		}
	}
}

// An acquire (first attempt, queued or try; a later attempt) that meets a
// key of the wrong type fails having written nothing, even with an ended
// lease to reclaim first (TestSemaphoreWrongTypeIsAnErrorAndWritesNothing
// runs on an empty semaphore, where nothing comes before the checks, and
// leaves out the waiters and the withdrawn calls).
func TestReview18AcquireWithAReclaimMeetingWrongTypeWritesNothing(t *testing.T) {
	attempts := map[string]semAcquireArgs{
		"queue":  {holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"try":    {holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "try", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"later":  {holder: "B", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "B#1", queued: true, heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"resize": {holder: "C", n: 1, size: 4, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
	}
	for name, a := range attempts {
		for _, suffix := range []string{"", ":expiry", ":queue", ":waiters", ":withdrawn", ":size"} {
			t.Run(name+suffix, func(t *testing.T) {
				mr, rdb, k := review18Sem(t)
				mr.HSet(k.Holders, "E", "1:1")
				if _, err := mr.ZAdd(k.Expiry, 1, "E"); err != nil { // an ended lease
					t.Fatal(err)
				}
				review18Wrong(t, mr, k, semKey+suffix)
				before := mr.Dump()
				err := a.call(k).run(ctx, rdb).Err()
				if err == nil || !errors.Is(redisError(err), ErrWrongType) {
					t.Fatalf("acquire: %v, want a WRONGTYPE error", err)
				}
				if after := mr.Dump(); after != before {
					t.Fatalf("the failed acquire wrote:\nbefore:\n%s\nafter:\n%s", before, after)
				}
			})
		}
	}
}
