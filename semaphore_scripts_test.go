package redisync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/watchdog"
)

// The semaphore scripts make no read only to check a key's type: they
// count on a later read before any write. These
// tests put a write in front of that later read (something for the script
// to prune or store first), so that a read taken out, or moved after a
// write, shows as a failed script that wrote.

// fullSemWithWaiter returns a semaphore of size 3 whose holder "A" holds all 3
// permits and whose waiter "B#1" is queued for 1, set up by the scripts
// themselves.
func fullSemWithWaiter(t *testing.T) (*miniredis.Miniredis, *redis.Client, schema.Semaphore) {
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

// putWrongType replaces key by a list (with a TTL, as redisync's keys
// have) and adds a remembered release whose time is over: the script's
// prune of the released zset is then a real write.
func putWrongType(t *testing.T, mr *miniredis.Miniredis, k schema.Semaphore, key string) {
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
func TestSemaphoreScriptsReleaseWithAPruneMeetingWrongTypeWritesNothing(t *testing.T) {
	for _, mode := range []string{"release", "withdraw"} {
		for _, suffix := range []string{":expiry", ":queue", ":waiters", ":withdrawn"} {
			t.Run(mode+suffix, func(t *testing.T) {
				mr, rdb, k := fullSemWithWaiter(t)
				putWrongType(t, mr, k, semKey+suffix)
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

// A holder record that redisync did not write fails a script that reads
// it, before the script writes anything: the caller's own record, and the
// record of a holder whose lease ended (which the script reclaims). A
// script reads no other record (its work does not grow with the holders):
// another live holder's junk record is left as it is. The semaphore here
// has an ended lease to reclaim and a remembered release to prune, so that
// a check made after either shows.
func TestSemaphoreScriptsJunkHolderRecordFailsBeforeAnyWrite(t *testing.T) {
	calls := map[string]struct {
		holder string
		call   func(k schema.Semaphore) scriptCall
	}{
		"acquire try": {"C", func(k schema.Semaphore) scriptCall {
			return semAcquireArgs{holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "try", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"}.call(k)
		}},
		"acquire queue": {"C", func(k schema.Semaphore) scriptCall {
			return semAcquireArgs{holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"}.call(k)
		}},
		"release": {"A", func(k schema.Semaphore) scriptCall {
			return semReleaseArgs{holder: "A", n: 1, held: 3, seq: 2, mode: "release", lease: time.Minute, size: 3, publish: "PUBLISH"}.call(k)
		}},
		"withdraw": {"B", func(k schema.Semaphore) scriptCall {
			return semReleaseArgs{holder: "B", n: 1, held: 0, seq: 2, mode: "withdraw", waiter: "B#1", lease: time.Minute, size: 3, publish: "PUBLISH"}.call(k)
		}},
	}
	for name, c := range calls {
		for _, junk := range []string{"own", "ended", "another's"} {
			t.Run(name+"/"+junk, func(t *testing.T) {
				mr, rdb, k := fullSemWithWaiter(t)
				if _, err := mr.ZAdd(k.Released, 1, "old:1"); err != nil {
					t.Fatal(err)
				}
				mr.SetTTL(k.Released, time.Minute)
				mr.HSet(k.Holders, "E", "1:1")
				if _, err := mr.ZAdd(k.Expiry, 1, "E"); err != nil { // an ended lease
					t.Fatal(err)
				}
				switch junk {
				case "own":
					mr.HSet(k.Holders, c.holder, "junk")
				case "ended":
					mr.HSet(k.Holders, "E", "junk")
				default:
					mr.HSet(k.Holders, "Z", "junk")
					if _, err := mr.ZAdd(k.Expiry, float64(time.Now().Add(time.Hour).UnixMilli()), "Z"); err != nil {
						t.Fatal(err)
					}
				}
				before := mr.Dump()
				err := c.call(k).run(ctx, rdb).Err()
				if junk == "another's" {
					if err != nil {
						t.Fatalf("%s: %v; another live holder's record is not read", name, err)
					}
					if v := mr.HGet(k.Holders, "Z"); v != "junk" {
						t.Fatalf("%s: Z's record is %q", name, v)
					}
					return
				}
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
func TestSemaphoreScriptsAcquireWithAReclaimMeetingWrongTypeWritesNothing(t *testing.T) {
	attempts := map[string]semAcquireArgs{
		"queue":  {holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"try":    {holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "try", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"later":  {holder: "B", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "B#1", queued: true, heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"resize": {holder: "C", n: 1, size: 4, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
	}
	for name, a := range attempts {
		for _, suffix := range []string{"", ":expiry", ":queue", ":waiters", ":withdrawn", ":size"} {
			t.Run(name+suffix, func(t *testing.T) {
				mr, rdb, k := fullSemWithWaiter(t)
				mr.HSet(k.Holders, "E", "1:1")
				if _, err := mr.ZAdd(k.Expiry, 1, "E"); err != nil { // an ended lease
					t.Fatal(err)
				}
				putWrongType(t, mr, k, semKey+suffix)
				before := mr.Dump()
				err := a.call(k).run(ctx, rdb).Err()
				if err == nil && (suffix == ":withdrawn" || suffix == ":size") {
					// Read only when they may say something (a withdrawal in
					// the last two minutes; a hash without its size): the
					// call did not touch them.
					if l, _ := mr.List(semKey + suffix); !slices.Equal(l, []string{"x"}) {
						t.Fatalf("acquire wrote %s: %v", suffix, l)
					}
					return
				}
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

// The semaphore scripts read the holders once (sem_load) and
// the queue head once (sem_peek), and sem_serve reports whether it stopped
// at a live waiter. The tests here run today's scripts
// and those of the reference (copied into testdata/semaphore-9826e3b) side by side, on a
// real Redis, from the same states with the same arguments and the same
// server clock, and require the same replies, the same state afterwards
// and the same messages published: the change was to read less, not to
// behave otherwise. A later change that means to change what the
// semaphore scripts do updates the copy, or these tests, with it.

// diffClock is the fake server clock of the tests, in ms.
const diffClock = int64(1_790_000_000_000)

// diffScripts are the three semaphore scripts of one version, reading the
// server clock from their last key (a hash with fields s and us) instead
// of TIME, so that two versions run at the same instant.
type diffScripts struct {
	name                     string
	acquire, release, resize *luaScript
}

// diffClocked returns lib.lua (lib) reading the clock from the last key.
func diffClocked(t *testing.T, lib string) string {
	t.Helper()
	const call = "redis.call('TIME')"
	if strings.Count(lib, call) != 1 {
		t.Fatalf("lib.lua: want one %s", call)
	}
	return strings.Replace(lib, call, "redis.call('HMGET', KEYS[#KEYS], 's', 'us')", 1)
}

// diffReplace returns src with its one occurrence of old replaced by new.
func diffReplace(t *testing.T, src, old, new string) string {
	t.Helper()
	if strings.Count(src, old) != 1 {
		t.Fatalf("want one %s", old)
	}
	return strings.Replace(src, old, new, 1)
}

// diffVersions returns the scripts of diffBase (testdata/semaphore-9826e3b, a copy)
// and of the worktree.
func diffVersions(t *testing.T) (old, cur diffScripts) {
	t.Helper()
	read := func(file string) string {
		b, err := os.ReadFile(filepath.Join("testdata", "semaphore-9826e3b", file))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// The reference took a remembered release, or a withdrawn call, for
	// one until a later call pruned it; the worktree's scripts remember
	// them for exactly their time (sem_lib.lua, sem_retire and
	// mark_withdrawn), and so does the reference here.
	oldLib := diffReplace(t, diffClocked(t, read("lib.lua")), "return redis.call('ZSCORE', gone, ticket) ~= false",
		"return (tonumber(redis.call('ZSCORE', gone, ticket)) or 0) > now_ms() - withdrawn_ms")
	// The worktree's sem_serve stops once a grant leaves no permit free
	// (it drops dead waiters further back only when one fits); so does
	// the reference here.
	oldSem := diffReplace(t, read("sem_lib.lua"), "      used = used + want\n    end\n  end",
		"      used = used + want\n      if used >= size then\n        break\n      end\n    end\n  end")
	oldAcquire := diffReplace(t, read("sem_acquire.lua"), "redis.call('ZSCORE', KEYS[7], holder)",
		"(tonumber(redis.call('ZSCORE', KEYS[7], holder)) or 0) > now_ms()")
	// The worktree's first attempt that finds every permit in use joins
	// the queue without serving it (dead waiters at its head are dropped
	// by a call that finds room, or by a later attempt); so does the
	// reference here.
	oldAcquire = diffReplace(t, oldAcquire,
		"local used, served, t = sem_serve(k, size, sem_used(k), now, waiter, lease, seq, ARGV[12], ARGV[13])",
		"local used, served, t = sem_used(k), false, 0\n"+
			"if ARGV[9] == '1' or used < size then\n"+
			"  used, served, t = sem_serve(k, size, used, now, waiter, lease, seq, ARGV[12], ARGV[13])\n"+
			"end")
	oldRelease := diffReplace(t, read("sem_release.lua"), "redis.call('ZSCORE', released, holder .. ':' .. seq)",
		"(tonumber(redis.call('ZSCORE', released, holder .. ':' .. seq)) or 0) > now_ms()")
	old = diffScripts{"old",
		testScript(oldLib + oldSem + oldAcquire),
		testScript(oldLib + oldSem + oldRelease),
		testScript(oldLib + oldSem + read("sem_resize.lua"))}
	lib := diffClocked(t, luaLib)
	cur = diffScripts{"new",
		testScript(lib + luaSemLib + luaSemAcquire),
		testScript(lib + luaSemLib + luaSemRelease),
		testScript(lib + luaSemLib + luaSemResize)}
	return old, cur
}

// diffNS is one namespace of keys on the shared Redis. The reference's
// layout is 2; the worktree's (cur) is schema.SemLayout, which also keeps
// the permits in use in the holders hash (schema.SemUsedField): a state
// written for the reference is carried over (migrate), and a dump of the
// worktree's reads as the reference's (after checking the count).
type diffNS struct {
	prefix string
	keys   schema.Semaphore
	clock  string
	cur    bool
}

// diffRecord matches a holder record: permits, then the call number.
var diffRecord = regexp.MustCompile(`^(\d+):\d+$`)

// migrate turns a state written in layout 2 into the worktree's layout:
// the size record's layout; the holders hash's own fields: the count of
// the permits in use, the size, the time until which every key lives
// (the least TTL: none when a key has none), and the times until which
// the released and withdrawn zsets may refuse an id, from their entries.
func (ns diffNS) migrate(ctx context.Context, rdb *redis.Client) {
	if v, err := rdb.Get(ctx, ns.keys.Size).Result(); err == nil && strings.HasSuffix(v, ":2") {
		ttl := rdb.PTTL(ctx, ns.keys.Size).Val()
		rdb.Set(ctx, ns.keys.Size, strings.TrimSuffix(v, ":2")+":"+strconv.Itoa(schema.SemLayout), max(ttl, 0))
	}
	now := ns.now(ctx, rdb)
	own := map[string]any{}
	if used := diffUsed(rdb.HGetAll(ctx, ns.keys.Holders).Val()); used > 0 {
		own[schema.SemUsedField] = used
	}
	if v, err := rdb.Get(ctx, ns.keys.Size).Result(); err == nil {
		if _, layout, ok := schema.ParseSemSize(v); ok && layout == schema.SemLayout {
			own["{size}"] = v
		}
	}
	least := time.Duration(-1)
	for _, key := range []string{ns.keys.Holders, ns.keys.Expiry, ns.keys.Size, ns.keys.Queue, ns.keys.Waiters} {
		switch ttl := rdb.PTTL(ctx, key).Val(); {
		case ttl == -1 || (ttl >= 0 && least == 0):
			least = 0 // a key without a TTL: the keys are to be kept
		case ttl >= 0 && (least < 0 || ttl < least):
			least = ttl
		}
	}
	if least > 0 {
		own["{keep}"] = now + least.Milliseconds()
	}
	for _, z := range rdb.ZRangeWithScores(ctx, ns.keys.Released, 0, -1).Val() {
		if m := fmt.Sprint(z.Member); !strings.Contains(m, ":") && int64(z.Score) > now {
			own["{gone}"] = max(int64(z.Score), toInt(own["{gone}"]))
		}
	}
	for _, z := range rdb.ZRangeWithScores(ctx, ns.keys.Withdrawn, 0, -1).Val() {
		own["{refuse}"] = max(int64(z.Score)+120_000, toInt(own["{refuse}"]))
	}
	if len(own) > 0 && rdb.Type(ctx, ns.keys.Holders).Val() != "string" && rdb.Type(ctx, ns.keys.Holders).Val() != "list" {
		ttl := rdb.PTTL(ctx, ns.keys.Holders).Val()
		rdb.HSet(ctx, ns.keys.Holders, own)
		if ttl > 0 {
			rdb.PExpire(ctx, ns.keys.Holders, ttl)
		} else if ttl == -2 && least > 0 {
			rdb.PExpire(ctx, ns.keys.Holders, least)
		}
	}
}

// toInt returns v, an int64 or nil, as an int64.
func toInt(v any) int64 {
	n, _ := v.(int64)
	return n
}

// now returns the namespace's server clock in ms (see setClock).
func (ns diffNS) now(ctx context.Context, rdb *redis.Client) int64 {
	v := rdb.HMGet(ctx, ns.clock, "s", "us").Val()
	sec, _ := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
	us, _ := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	return sec*1000 + us/1000
}

// diffUsed sums the permits of the holder records in h.
func diffUsed(h map[string]string) (used int64) {
	for f, v := range h {
		if m := diffRecord.FindStringSubmatch(v); m != nil && !slices.Contains(schema.SemFields, f) {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			used += n
		}
	}
	return used
}

func diffNamespace(prefix string) diffNS {
	k := schema.SemaphoreKeys(prefix, "r21")
	return diffNS{prefix: prefix, keys: k, clock: k.Holders + ":clock", cur: prefix == "r21new"}
}

// setClock sets the namespace's server clock to ms.
func (ns diffNS) setClock(ctx context.Context, rdb *redis.Client, ms int64) {
	rdb.HSet(ctx, ns.clock, "s", ms/1000, "us", (ms%1000)*1000)
	rdb.PExpire(ctx, ns.clock, time.Hour)
}

// clear removes every key of the namespace.
func (ns diffNS) clear(ctx context.Context, rdb *redis.Client) {
	keys, _ := rdb.Keys(ctx, ns.prefix+":*").Result()
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}

// diffOp is one script call, in a form that fits any namespace.
type diffOp struct {
	kind string // "acquire", "release", "resize"
	acq  semAcquireArgs
	rel  semReleaseArgs
	from int64
	to   int64
}

func (op diffOp) String() string {
	switch op.kind {
	case "acquire":
		a := op.acq
		return fmt.Sprintf("acquire(holder=%s n=%d size=%d held=%d seq=%d lease=%v mode=%s waiter=%s queued=%v hb=%v grant=%v fence=%v)",
			a.holder, a.n, a.size, a.held, a.seq, a.lease, a.mode, a.waiter, a.queued, a.heartbeat, a.grant, a.fence)
	case "release":
		r := op.rel
		return fmt.Sprintf("release(holder=%s n=%d held=%d seq=%d mode=%s waiter=%q lease=%v size=%d fence=%v)",
			r.holder, r.n, r.held, r.seq, r.mode, r.waiter, r.lease, r.size, r.fence)
	}
	return fmt.Sprintf("resize(%d -> %d)", op.from, op.to)
}

// run runs op with the scripts sc in the namespace ns and returns its reply,
// normalized (error text without script names or line numbers, and
// without the namespace's prefix).
func (op diffOp) run(ctx context.Context, rdb *redis.Client, sc diffScripts, ns diffNS) string {
	var c scriptCall
	switch op.kind {
	case "acquire":
		a := op.acq
		a.publish = "RPUSH" // messages land in a list named after the channel
		// The caller's size is the stored one, and n no more than it: the
		// reference refuses another size, where the worktree's script
		// works with the stored one and refuses n above it.
		if v, err := rdb.Get(ctx, ns.keys.Size).Result(); err == nil {
			if stored, err := strconv.ParseInt(strings.Split(v, ":")[0], 10, 64); err == nil && stored > 0 {
				a.size, a.n = stored, min(a.n, stored)
			}
		}
		// An attempt of a call that may have queued it says so (ARGV[9]):
		// the worktree's script looks for the waiter in the queue only
		// then.
		if rdb.ZScore(ctx, ns.keys.Queue, a.waiter).Err() == nil {
			a.queued = true
		}
		c = a.call(ns.keys)
		c.script = sc.acquire
	case "release":
		r := op.rel
		r.publish = "RPUSH"
		// The reference refuses the id of every holding a release ends;
		// the worktree's, of those whose calls may still be on their way.
		r.refuse = true
		c = r.call(ns.keys)
		c.script = sc.release
	default:
		c = semResizeArgs{from: op.from, to: op.to, publish: "RPUSH"}.call(ns.keys)
		c.script = sc.resize
	}
	c.keys = append(slices.Clone(c.keys), ns.clock)
	v, err := c.run(ctx, rdb).Result()
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), ns.prefix, "P")
		if ns.cur {
			msg = strings.ReplaceAll(msg, "reads layout "+strconv.Itoa(schema.SemLayout), "reads layout 2")
		}
		return "error: " + diffNormalizeErr(msg)
	}
	if r, ok := v.([]any); ok && op.kind == "acquire" && ns.cur && len(r) == 3 {
		v = r[:2] // the size the worktree's script adds to its reply
	}
	return fmt.Sprint(v)
}

var diffErrNoise = regexp.MustCompile(`(?s)stack traceback:.*$|(script: [0-9a-f]{40}, )?on @user_script:\d+\.?|user_script:\d+: ?|[0-9a-f]{40}|:\d+:`)

func diffNormalizeErr(s string) string {
	return strings.TrimSpace(diffErrNoise.ReplaceAllString(s, ""))
}

// dump returns the state of the namespace (but its clock) as text: every
// key with its type, value and whether it has a TTL, with the TTLs apart.
// Entries of the released zset whose time is over are left out (the
// versions prune them at different calls), as is a holders hash of the
// worktree that holds only its own fields (schema.SemFields).
func (ns diffNS) dump(ctx context.Context, rdb *redis.Client) (string, map[string]int64) {
	keys, err := rdb.Keys(ctx, ns.prefix+":*").Result()
	if err != nil {
		panic(err)
	}
	sort.Strings(keys)
	now := ns.now(ctx, rdb)
	var b strings.Builder
	ttls := map[string]int64{}
	for _, key := range keys {
		if key == ns.clock {
			continue
		}
		var line strings.Builder
		name := strings.Replace(key, ns.prefix, "P", 1)
		typ := rdb.Type(ctx, key).Val()
		fmt.Fprintf(&line, "%s (%s", name, typ)
		// A key's TTL is compared apart (see step): the worktree's scripts
		// give one to a key that has none.
		if ttl := rdb.PTTL(ctx, key).Val(); ttl >= 0 && key != ns.keys.Released {
			ttls[name] = ttl.Milliseconds()
		}
		line.WriteString("): ")
		entries := 0
		switch typ {
		case "string":
			v := rdb.Get(ctx, key).Val()
			if l := ":" + strconv.Itoa(schema.SemLayout); ns.cur && key == ns.keys.Size && strings.HasSuffix(v, l) {
				v = strings.TrimSuffix(v, l) + ":2"
			}
			line.WriteString(v)
			entries++
		case "hash":
			m := rdb.HGetAll(ctx, key).Val()
			if ns.cur && key == ns.keys.Holders {
				if want, got := diffUsed(m), m[schema.SemUsedField]; got != fmt.Sprint(want) && (want > 0 || got != "") {
					fmt.Fprintf(&line, "[%s is %q, the records hold %d] ", schema.SemUsedField, got, want)
					entries++
				}
				for _, f := range schema.SemFields {
					delete(m, f)
				}
			}
			fs := make([]string, 0, len(m))
			for f := range m {
				fs = append(fs, f)
			}
			sort.Strings(fs)
			for _, f := range fs {
				fmt.Fprintf(&line, "%s=%s ", f, m[f])
				entries++
			}
		case "zset":
			for _, z := range rdb.ZRangeWithScores(ctx, key, 0, -1).Val() {
				if key == ns.keys.Released && int64(z.Score) <= now {
					continue // forgotten: pruned now or later
				}
				fmt.Fprintf(&line, "%v=%.0f ", z.Member, z.Score)
				entries++
			}
		case "list":
			line.WriteString(strings.Join(rdb.LRange(ctx, key, 0, -1).Val(), " | "))
			entries++
		}
		if entries == 0 && (key == ns.keys.Released || (ns.cur && key == ns.keys.Holders)) {
			delete(ttls, name)
			continue
		}
		b.WriteString(line.String())
		b.WriteString("\n")
	}
	return strings.ReplaceAll(b.String(), ns.prefix, "P"), ttls
}

// diffWorld builds random states and calls from a small universe of ids.
type diffWorld struct {
	rng   *rand.Rand
	size  int64
	fence bool
	now   int64
	// garbage is the chance of a garbage value or a key of the wrong type
	garbage float64
	// wrong names the one key of the wrong type, if any
	wrong string
}

var diffHolders = []string{"app/c1-1", "app/c1-2", "app/c2-1", "app/c3-1"}

func (w *diffWorld) holder() string { return diffHolders[w.rng.Intn(len(diffHolders))] }

func (w *diffWorld) waiterOf(holder string) string {
	return holder + "#" + strconv.Itoa(1+w.rng.Intn(3))
}

func (w *diffWorld) chance(p float64) bool { return w.rng.Float64() < p }

func (w *diffWorld) between(lo, hi int64) int64 { return lo + w.rng.Int63n(hi-lo+1) }

// diffWrite is one command that builds a state.
type diffWrite func(ctx context.Context, rdb *redis.Client, k schema.Semaphore)

// state returns the writes of a random state, the same in any namespace.
func (w *diffWorld) state() (ws []diffWrite) {
	add := func(f diffWrite) { ws = append(ws, f) }
	hset := func(key func(k schema.Semaphore) string, field, value string) {
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.HSet(ctx, key(k), field, value) })
	}
	zadd := func(key func(k schema.Semaphore) string, member string, score int64) {
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
			rdb.ZAdd(ctx, key(k), redis.Z{Score: float64(score), Member: member})
		})
	}
	wrongType := func(key func(k schema.Semaphore) string, asString bool) {
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
			if asString {
				rdb.Set(ctx, key(k), "x", 0)
			} else {
				rdb.RPush(ctx, key(k), "x")
			}
		})
	}
	holders := func(k schema.Semaphore) string { return k.Holders }
	expiry := func(k schema.Semaphore) string { return k.Expiry }
	queue := func(k schema.Semaphore) string { return k.Queue }
	waiters := func(k schema.Semaphore) string { return k.Waiters }
	released := func(k schema.Semaphore) string { return k.Released }
	withdrawn := func(k schema.Semaphore) string { return k.Withdrawn }
	size := func(k schema.Semaphore) string { return k.Size }
	token := func(k schema.Semaphore) string { return k.Token }
	g := w.garbage
	if w.wrong != "" {
		g = 0
		defer func() {
			key := w.wrong
			ws = append(ws, func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
				name := map[string]string{"holders": k.Holders, "expiry": k.Expiry, "size": k.Size, "queue": k.Queue,
					"waiters": k.Waiters, "released": k.Released, "withdrawn": k.Withdrawn, "token": k.Token}[key]
				rdb.Del(ctx, name)
				if key == "size" || key == "token" {
					rdb.RPush(ctx, name, "x")
				} else {
					rdb.Set(ctx, name, "x", 0)
				}
			})
		}()
	}

	// size
	switch r := w.rng.Float64(); {
	case r < g:
		wrongType(size, false)
	case r < 2*g:
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.Set(ctx, k.Size, "x:y", 0) })
	case r < 0.05:
	case r < 0.08:
		s := fmt.Sprint(w.size)
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.Set(ctx, k.Size, s, 0) })
	case r < 0.11:
		s := fmt.Sprintf("%d:2", w.size+1)
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.Set(ctx, k.Size, s, 0) })
	default:
		s := fmt.Sprintf("%d:2", w.size)
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.Set(ctx, k.Size, s, 0) })
	}
	// holders and their leases
	if w.chance(g) {
		wrongType(holders, true)
	}
	if w.chance(g) {
		wrongType(expiry, true)
	}
	for _, h := range diffHolders {
		if !w.chance(0.4) {
			continue
		}
		rec := fmt.Sprintf("%d:%d", w.between(1, w.size), w.between(1, 6))
		if w.chance(g) {
			// A record redisync did not write, whose lease has ended: both
			// versions read it (the reference reads every record, the
			// worktree's the ended ones) and fail.
			hset(holders, h, []string{"bad", "1:x", "", "-1:2", "1:2:3"}[w.rng.Intn(5)])
			zadd(expiry, h, w.now-w.between(1, 2000))
			continue
		}
		hset(holders, h, rec)
		if w.chance(0.9) {
			zadd(expiry, h, w.now+w.between(-2000, 5000))
		}
	}
	if w.chance(0.1) {
		zadd(expiry, "app/c9-1", w.now+w.between(-2000, 5000)) // a lease without a record
	}
	// the queue and the waiters
	if w.chance(g) {
		wrongType(queue, true)
	}
	if w.chance(g) {
		wrongType(waiters, true)
	}
	var all []string
	for _, h := range diffHolders {
		for i := 1; i <= 3; i++ {
			all = append(all, h+"#"+strconv.Itoa(i))
		}
	}
	w.rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	score := w.now*1000 - 10_000_000
	for _, id := range all {
		inQueue := w.chance(0.3)
		if inQueue {
			score += w.between(1, 1000)
			zadd(queue, id, score)
		}
		if (inQueue && w.chance(0.9)) || (!inQueue && w.chance(0.05)) {
			want := w.between(1, w.size)
			if w.fence && w.chance(0.5) {
				want = w.size
			}
			rec := fmt.Sprintf("%d:%d:%d:%d", w.now+w.between(-2000, 3000), []int64{500, 1000}[w.rng.Intn(2)], want, w.between(1, 6))
			if w.chance(g) {
				rec = []string{"bad", "1:2", fmt.Sprintf("%d:1:1:x", w.now+1000), fmt.Sprintf("%d:500:%d:1", w.now+1000, w.size+1)}[w.rng.Intn(4)]
			}
			hset(waiters, id, rec)
		}
	}
	for _, c := range []string{"c1", "c2", "c3"} {
		if w.chance(0.4) {
			v := fmt.Sprint(w.now + w.between(-3000, 3000))
			if w.chance(0.2) {
				v += ":L"
			}
			hset(waiters, "{client}"+c, v)
		}
	}
	// released and withdrawn calls
	if w.chance(g) {
		wrongType(released, true)
	}
	if w.chance(g) {
		wrongType(withdrawn, true)
	}
	for _, h := range diffHolders {
		if w.chance(0.15) {
			e := w.now + w.between(-1000, 5000)
			zadd(released, h, e)
			zadd(released, fmt.Sprintf("%s:%d", h, w.between(1, 6)), e)
		}
	}
	for _, id := range all {
		if w.chance(0.05) {
			zadd(withdrawn, id, w.now-w.between(0, 200_000))
		}
	}
	// the fencing token counter
	switch r := w.rng.Float64(); {
	case r < g:
		wrongType(token, false)
	case r < 2*g:
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.Set(ctx, k.Token, "x", 0) })
	case r < 0.5:
		v := w.now*1000 - w.between(0, 5_000_000)
		add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.Set(ctx, k.Token, v, 0) })
	}
	// TTLs: most keys have one
	ttl := time.Duration(w.between(5, 3600)) * time.Second
	noTTL := w.chance(0.2)
	add(func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
		if noTTL {
			return
		}
		for _, key := range []string{k.Holders, k.Expiry, k.Size, k.Queue, k.Waiters, k.Released, k.Withdrawn, k.Token} {
			rdb.PExpire(ctx, key, ttl)
		}
	})
	return ws
}

// op returns a random call.
func (w *diffWorld) op() diffOp {
	h := w.holder()
	switch r := w.rng.Float64(); {
	case r < 0.55:
		n := w.between(1, w.size)
		if w.fence && w.chance(0.5) {
			n = w.size
		}
		var held int64
		if w.chance(0.4) {
			held = w.between(1, w.size)
		}
		waiter := w.waiterOf(h)
		if w.chance(0.05) {
			waiter = w.waiterOf(w.holder())
		}
		// Always the stored size: the reference refuses another one,
		// where the worktree's script works with the stored one.
		return diffOp{kind: "acquire", acq: semAcquireArgs{holder: h, n: n, size: w.size, held: held, seq: w.between(1, 8),
			lease: time.Duration(w.between(1, 5)) * time.Second, mode: []string{"queue", "queue", "try"}[w.rng.Intn(3)],
			waiter: waiter, queued: w.chance(0.5), heartbeat: time.Duration(w.between(1, 3)) * time.Second,
			grant: 500 * time.Millisecond, fence: w.fence}}
	case r < 0.95:
		mode, waiter := "release", ""
		if w.chance(0.4) {
			mode = "withdraw"
		}
		if mode == "withdraw" || w.chance(0.5) {
			waiter = w.waiterOf(h)
		}
		n := w.between(1, w.size)
		if w.fence && w.chance(0.5) {
			n = w.size
		}
		return diffOp{kind: "release", rel: semReleaseArgs{holder: h, n: n, held: w.between(0, w.size), seq: w.between(1, 8),
			// The longest lease: a partial release re-arms the holder's
			// lease, which the reference may shorten and the worktree
			// never does (a lease set by Extend stays).
			mode: mode, waiter: waiter, lease: 5 * time.Second, size: w.size, fence: w.fence}}
	}
	from := w.size
	if w.chance(0.2) {
		from = w.between(1, 6)
	}
	return diffOp{kind: "resize", from: from, to: w.between(1, 6)}
}

// informed returns a random call whose arguments mostly agree with the
// state in ns (what a live caller sends): held is what the holder holds,
// seq follows the holder's, a queued waiter says it is queued.
func (w *diffWorld) informed(ctx context.Context, rdb *redis.Client, ns diffNS) diffOp {
	op := w.op()
	held := map[string][2]int64{}
	if m, err := rdb.HGetAll(ctx, ns.keys.Holders).Result(); err == nil {
		for h, v := range m {
			if r, ok := schema.ParseSemHolder(v); ok {
				held[h] = [2]int64{r.Permits, r.Seq}
			}
		}
	}
	queued, _ := rdb.ZRange(ctx, ns.keys.Queue, 0, -1).Result()
	pick := func(h string) (int64, int64) {
		r := held[h]
		seq := r[1] + 1
		switch x := w.rng.Float64(); {
		case x < 0.1:
			seq = r[1] // a retry
		case x < 0.15 && r[1] > 1:
			seq = r[1] - 1 // a stale copy
		case x < 0.4:
			seq = r[1] + w.between(1, 4)
		}
		return r[0], seq
	}
	switch op.kind {
	case "acquire":
		a := &op.acq
		if len(queued) > 0 && w.chance(0.5) {
			a.waiter = queued[w.rng.Intn(len(queued))]
			a.holder = strings.SplitN(a.waiter, "#", 2)[0]
			a.queued = w.chance(0.9)
			a.mode = "queue"
		}
		if w.chance(0.8) {
			a.held, a.seq = pick(a.holder)
		}
	case "release":
		r := &op.rel
		if len(queued) > 0 && w.chance(0.4) {
			r.waiter = queued[w.rng.Intn(len(queued))]
			r.holder = strings.SplitN(r.waiter, "#", 2)[0]
		}
		if w.chance(0.8) {
			r.held, r.seq = pick(r.holder)
			if r.held > 0 && r.mode == "release" {
				r.n = w.between(1, r.held)
			}
		}
	}
	return op
}

// diffPair runs the same states and calls in the parent's scripts and in
// the worktree's, each in a namespace of its own.
type diffPair struct {
	t        *testing.T
	rdb      *redis.Client
	old, cur diffScripts
	nsOld    diffNS
	nsCur    diffNS
}

// newDiffPair uses the package's real Redis (redistest), or miniredis when
// there is none (or REDISYNC_DIFF_MINI=1).
func newDiffPair(t *testing.T) *diffPair {
	t.Helper()
	old, cur := diffVersions(t)
	var rdb *redis.Client
	_, noServer := exec.LookPath("redis-server")
	if os.Getenv("REDISYNC_DIFF_MINI") == "1" || (os.Getenv("REDIS_ADDR") == "" && noServer != nil) {
		_, rdb, _ = newMini(t)
	} else {
		rdb = redistest.Client(t)
	}
	p := &diffPair{t: t, rdb: rdb, old: old, cur: cur,
		nsOld: diffNamespace("r21old"), nsCur: diffNamespace("r21new")}
	t.Cleanup(func() {
		p.nsOld.clear(context.Background(), rdb)
		p.nsCur.clear(context.Background(), rdb)
	})
	return p
}

// reset writes the state ws, at clock now, in both namespaces.
func (p *diffPair) reset(ctx context.Context, ws []diffWrite, now int64) {
	for _, ns := range []diffNS{p.nsOld, p.nsCur} {
		ns.clear(ctx, p.rdb)
		for _, f := range ws {
			f(ctx, p.rdb, ns.keys)
		}
		ns.setClock(ctx, p.rdb, now)
		if ns.cur {
			ns.migrate(ctx, p.rdb)
		}
	}
}

// diffFault reports whether a reply is the error of a key of the wrong
// type or of another layout.
func diffFault(reply string) bool {
	return strings.Contains(reply, "WRONGTYPE") || strings.Contains(reply, "LAYOUT")
}

// untouched reports whether the worktree's key named wrong ("released",
// "withdrawn", "size", "token", "queue" or "waiters") is of the wrong
// type, as the tests set it.
func (p *diffPair) untouched(ctx context.Context, wrong string) bool {
	k := p.nsCur.keys
	key := map[string]string{"released": k.Released, "withdrawn": k.Withdrawn, "size": k.Size, "token": k.Token,
		"queue": k.Queue, "waiters": k.Waiters}[wrong]
	switch p.rdb.Type(ctx, key).Val() {
	case "string":
		return wrong != "size" && wrong != "token" && p.rdb.Get(ctx, key).Val() == "x"
	case "list":
		return slices.Equal(p.rdb.LRange(ctx, key, 0, -1).Val(), []string{"x"})
	}
	return false
}

// step runs op in both namespaces and returns the replies and states, and
// "" or a description of how they differ.
func (p *diffPair) step(ctx context.Context, op diffOp) (oldReply, curReply, oldState, curState, diff string) {
	before, _ := p.nsCur.dump(ctx, p.rdb)
	oldReply = op.run(ctx, p.rdb, p.old, p.nsOld)
	curReply = op.run(ctx, p.rdb, p.cur, p.nsCur)
	oldState, oldTTL := p.nsOld.dump(ctx, p.rdb)
	curState, curTTL := p.nsCur.dump(ctx, p.rdb)
	switch {
	case strings.HasPrefix(curReply, "error") && curState != before:
		diff = "the new script failed after it wrote: before:\n" + before
	case oldReply != curReply && strings.Contains(oldReply, "does not hold a holder record") &&
		!strings.HasPrefix(curReply, "error") && curState == before:
		// The worktree's scripts read only the records a call needs
		// (the reference read every one): a call that ends before it
		// needs the record that redisync did not write changes nothing.
	case oldReply != curReply && strings.Contains(curReply, "WRONGTYPE") && curState == before && oldReply == "[-3 0]":
		// The worktree's scripts read the keys before they look for a
		// refusal (the reference, a withdrawn call first): each
		// changes nothing.
	case oldReply != curReply && diffFault(oldReply) && !strings.HasPrefix(curReply, "error") && curState == before:
		// The worktree's call read only what it needed, and changed
		// nothing (a first attempt that finds every permit in use reads
		// no queue, and a TryAcquire then writes nothing).
	case oldReply != curReply && diffFault(oldReply) && diffFault(curReply) && curState == before:
		// A state with two faults: the versions read them in another
		// order, and each fails having written nothing.
	case oldReply != curReply:
		diff = "replies differ"
	case oldState != curState:
		diff = "states differ"
	default:
		// The worktree's keys live at least as long as the reference's
		// (it pushes their TTLs out ahead of need, see sem_lib.lua,
		// sem_keep).
		for k, a := range oldTTL {
			if b, ok := curTTL[k]; !ok || a-b > 200 {
				diff = fmt.Sprintf("TTL of %s is shorter: %d ms, the reference's %d ms", k, b, a)
			}
		}
	}
	return
}

// diffState returns writes that build a state from simple descriptions:
// holders "id" -> "permits:seq" with their lease end (ms from now), and
// the queue in order with each waiter's record.
type diffHolder struct {
	id, rec string
	ends    int64 // ms from now
}

type diffWaiter struct{ id, rec string }

func diffState(now int64, size string, hs []diffHolder, q []diffWaiter) []diffWrite {
	return []diffWrite{func(ctx context.Context, c *redis.Client, k schema.Semaphore) {
		rdb := c.Pipeline()
		defer func() { _, _ = rdb.Exec(ctx) }()
		rdb.Set(ctx, k.Size, size, time.Hour)
		for _, h := range hs {
			rdb.HSet(ctx, k.Holders, h.id, h.rec)
			rdb.ZAdd(ctx, k.Expiry, redis.Z{Score: float64(now + h.ends), Member: h.id})
		}
		for i, w := range q {
			rdb.ZAdd(ctx, k.Queue, redis.Z{Score: float64(now*1000 + int64(i)), Member: w.id})
			if w.rec != "" {
				rdb.HSet(ctx, k.Waiters, w.id, w.rec)
			}
		}
		for _, key := range []string{k.Holders, k.Expiry, k.Queue, k.Waiters} {
			rdb.PExpire(ctx, key, time.Hour)
		}
	}}
}

// diffSame runs ops in order from the state ws in both versions and fails
// the test where they differ; it returns the last state of the worktree's.
func diffSame(t *testing.T, p *diffPair, ws []diffWrite, ops ...diffOp) string {
	t.Helper()
	ctx := context.Background()
	p.reset(ctx, ws, diffClock)
	var last string
	for i, op := range ops {
		or, cr, os, cs, diff := p.step(ctx, op)
		if diff != "" {
			t.Fatalf("step %d, %v: %s\nold: %s\nnew: %s\nstate (old):\n%s\nstate (new):\n%s", i, op, diff, or, cr, os, cs)
		}
		t.Logf("%v: %s", op, cr)
		last = cs
	}
	return last
}

func diffAcq(holder string, n, size, held, seq int64, mode, waiter string, queued, fence bool) diffOp {
	return diffOp{kind: "acquire", acq: semAcquireArgs{holder: holder, n: n, size: size, held: held, seq: seq, lease: 5 * time.Second,
		mode: mode, waiter: waiter, queued: queued, heartbeat: 2 * time.Second, grant: 500 * time.Millisecond, fence: fence}}
}

func diffRel(holder string, n, held, seq int64, mode, waiter string, size int64, fence bool) diffOp {
	return diffOp{kind: "release", rel: semReleaseArgs{holder: holder, n: n, held: held, seq: seq, mode: mode, waiter: waiter,
		lease: 5 * time.Second, size: size, fence: fence}}
}

// diffStranded returns the waiter ids that have a record in the waiters
// hash of ns but no place in its queue: nobody grants them.
func diffStranded(ctx context.Context, rdb *redis.Client, ns diffNS) []string {
	var out []string
	for f := range rdb.HGetAll(ctx, ns.keys.Waiters).Val() {
		if strings.HasPrefix(f, "{") {
			continue
		}
		if rdb.ZScore(ctx, ns.keys.Queue, f).Err() == redis.Nil {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// TestSemaphoreScriptsDifferentialRandomStates runs random calls on random states
// (a few with garbage values or keys of the wrong type) in the scripts of
// the parent commit and of the worktree, and requires the same replies,
// the same states and the same messages. A regression guard worth keeping
// while the parent's scripts are the reference.
func TestSemaphoreScriptsDifferentialRandomStates(t *testing.T) {
	ctx := context.Background()
	p := newDiffPair(t)
	seed := int64(21)
	if v, err := strconv.ParseInt(os.Getenv("REDISYNC_DIFF_SEED"), 10, 64); err == nil {
		seed = v
	}
	trials := 150
	if v, err := strconv.Atoi(os.Getenv("REDISYNC_DIFF_TRIALS")); err == nil {
		trials = v
	}
	stats := map[string]int{}
	defer func() { t.Logf("replies (new): %v", stats) }()
	rng := rand.New(rand.NewSource(seed))
	const steps = 10
	for trial := 0; trial < trials; trial++ {
		w := &diffWorld{rng: rng, size: []int64{1, 2, 3, 5}[rng.Intn(4)], fence: rng.Intn(3) == 0, now: diffClock}
		switch trial % 6 {
		case 0:
			w.garbage = 0.05
		case 3:
			w.wrong = []string{"holders", "expiry", "size", "queue", "waiters", "released", "withdrawn", "token"}[rng.Intn(8)]
		}
		p.reset(ctx, w.state(), w.now)
		before, _ := p.nsOld.dump(ctx, p.rdb)
		var log []string
		for i := 0; i < steps; i++ {
			op := w.op()
			if trial%2 == 1 {
				op = w.informed(ctx, p.rdb, p.nsOld)
			}
			log = append(log, op.String())
			or, cr, os, cs, diff := p.step(ctx, op)
			log = append(log, "  old: "+or, "  new: "+cr)
			key := op.kind + " " + cr
			if strings.HasPrefix(cr, "error") {
				key = op.kind + " error"
			} else if op.kind == "acquire" {
				key = op.kind + " " + strings.SplitN(strings.Trim(cr, "[]"), " ", 2)[0]
			}
			stats[key]++
			if diff != "" && strings.Contains(or, "WRONGTYPE") && !strings.HasPrefix(cr, "error") &&
				slices.ContainsFunc([]string{"released", "withdrawn", "size", "token", "queue", "waiters"}, func(key string) bool { return p.untouched(ctx, key) }) {
				// The worktree's call did not need the key of the wrong
				// type (see TestSemaphoreScriptsWrongTypeFailsBeforeWriting;
				// a first attempt that finds every permit in use reads no
				// queue, and may reclaim ended leases): the states part
				// here.
				break
			}
			if diff != "" {
				t.Fatalf("trial %d (seed %d), step %d: %s\ninitial state:\n%s\ncalls:\n%s\nstate (old):\n%s\nstate (new):\n%s",
					trial, seed, i, diff, before, strings.Join(log, "\n"), os, cs)
			}
			w.now += w.between(0, 1500)
			p.nsOld.setClock(ctx, p.rdb, w.now)
			p.nsCur.setClock(ctx, p.rdb, w.now)
		}
	}
}

// TestSemaphoreScriptsWrongTypeFailsBeforeWriting puts one key of the wrong type
// in a few states (an empty queue among them: sem_peek's HLEN is then the
// only read of the waiters hash before a write) and runs each kind of call:
// a call that fails must have changed nothing, and the parent's scripts
// must answer the same. A regression guard.
func TestSemaphoreScriptsWrongTypeFailsBeforeWriting(t *testing.T) {
	ctx := context.Background()
	p := newDiffPair(t)
	now := diffClock
	const size = 2
	lease := func(h string, ms int64) diffWrite {
		return func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
			rdb.ZAdd(ctx, k.Expiry, redis.Z{Score: float64(now + ms), Member: h})
		}
	}
	hset := func(key func(schema.Semaphore) string, f, v string) diffWrite {
		return func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) { rdb.HSet(ctx, key(k), f, v) }
	}
	holders := func(k schema.Semaphore) string { return k.Holders }
	waiters := func(k schema.Semaphore) string { return k.Waiters }
	sizeKey := func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
		rdb.Set(ctx, k.Size, "2:2", time.Hour)
	}
	states := map[string][]diffWrite{
		"idle":                {sizeKey},
		"full, nobody queued": {sizeKey, hset(holders, "app/c1-1", "2:3"), lease("app/c1-1", 5000)},
		"half, one queued": {sizeKey, hset(holders, "app/c1-1", "1:3"), lease("app/c1-1", 5000),
			func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
				rdb.ZAdd(ctx, k.Queue, redis.Z{Score: float64(now * 1000), Member: "app/c2-1#1"})
			},
			hset(waiters, "app/c2-1#1", fmt.Sprintf("%d:500:2:1", now+2000))},
	}
	ops := func(fence bool) []diffOp {
		acq := func(holder string, n, held, seq int64, mode, waiter string, queued bool) diffOp {
			return diffOp{kind: "acquire", acq: semAcquireArgs{holder: holder, n: n, size: size, held: held, seq: seq, lease: 5 * time.Second,
				mode: mode, waiter: waiter, queued: queued, heartbeat: 2 * time.Second, grant: 500 * time.Millisecond, fence: fence}}
		}
		rel := func(holder string, n, held, seq int64, mode, waiter string) diffOp {
			return diffOp{kind: "release", rel: semReleaseArgs{holder: holder, n: n, held: held, seq: seq, mode: mode, waiter: waiter,
				lease: 5 * time.Second, size: size, fence: fence}}
		}
		return []diffOp{
			acq("app/c3-1", 2, 0, 1, "queue", "app/c3-1#1", false),
			acq("app/c3-1", 1, 0, 1, "try", "app/c3-1#1", false),
			acq("app/c2-1", 2, 0, 2, "queue", "app/c2-1#1", true),
			acq("app/c1-1", 1, 2, 4, "queue", "app/c1-1#2", false),
			rel("app/c1-1", 2, 2, 4, "release", "app/c1-1#2"),
			rel("app/c1-1", 1, 2, 4, "release", ""),
			rel("app/c1-1", 1, 1, 4, "release", ""),
			rel("app/c2-1", 2, 0, 2, "withdraw", "app/c2-1#1"),
			rel("app/c3-1", 1, 0, 1, "withdraw", "app/c3-1#1"),
			{kind: "resize", from: size, to: size + 2},
			{kind: "resize", from: size, to: 1},
		}
	}
	for _, wrong := range []string{"holders", "expiry", "size", "queue", "waiters", "released", "withdrawn", "token"} {
		for name, st := range states {
			for _, fence := range []bool{false, true} {
				for _, op := range ops(fence) {
					ws := append(slices.Clone(st), func(ctx context.Context, rdb *redis.Client, k schema.Semaphore) {
						key := map[string]string{"holders": k.Holders, "expiry": k.Expiry, "size": k.Size, "queue": k.Queue,
							"waiters": k.Waiters, "released": k.Released, "withdrawn": k.Withdrawn, "token": k.Token}[wrong]
						rdb.Del(ctx, key)
						if wrong == "size" || wrong == "token" {
							rdb.RPush(ctx, key, "x")
						} else {
							rdb.Set(ctx, key, "x", 0)
						}
						rdb.PExpire(ctx, key, time.Hour)
					})
					p.reset(ctx, ws, now)
					or, cr, os, cs, diff := p.step(ctx, op)
					if diff != "" && !strings.HasPrefix(cr, "error") && p.untouched(ctx, wrong) {
						// The worktree's scripts read the released and
						// withdrawn zsets only while they may refuse
						// something, the size key only when the hash has no
						// size, and a RWMutex's token counter only when the
						// call may mint a token: a call that did not need
						// the key did not touch it.
						continue
					}
					if diff != "" {
						t.Errorf("%s of the wrong type, %s, %v: %s\nold: %s\nnew: %s\nstate (old):\n%s\nstate (new):\n%s",
							wrong, name, op, diff, or, cr, os, cs)
					}
				}
			}
		}
	}
}

// TestSemaphoreScriptsSizeAbove1e14: Lua writes a number of 1e14 or more as
// "1e+14", so a semaphore that large stored a size record its next call
// could not read ("does not hold a size"). Sizes above MaxSemaphoreSize
// now fail before any call to Redis, and MaxSemaphoreSize itself works
// (older than 4854a18: 9826e3b failed the same way).
func TestSemaphoreScriptsSizeAbove1e14(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	c := newClient(t, rdb, WithKeyPrefix("r21big"))
	for _, size := range []int64{1e14, MaxSemaphoreSize + 1} {
		checkInvalid(t, errOf(c.NewSemaphore("big", size)), ErrInvalidPermits)
		if err := c.ResizeSemaphore(ctx, "big", size, 2); !errors.Is(err, ErrInvalidPermits) {
			t.Errorf("resize from %d: %v, want ErrInvalidPermits", size, err)
		}
	}
	if n := rdb.Exists(ctx, schema.SemaphoreKeys("r21big", "big").Size).Val(); n != 0 {
		t.Fatalf("a refused size reached Redis")
	}
	if MaxSemaphoreSize != schema.RWMutexSize { // a RWMutex's write takes MaxSemaphoreSize permits
		t.Fatalf("MaxSemaphoreSize %d, a RWMutex's size %d", MaxSemaphoreSize, schema.RWMutexSize)
	}
	s := must(c.NewSemaphore("big", MaxSemaphoreSize))
	for i := 0; i < 2; i++ {
		if err := s.Acquire(ctx, MaxSemaphoreSize); err != nil {
			t.Fatalf("Acquire %d of the whole MaxSemaphoreSize: %v", i, err)
		}
		if err := s.Release(ctx, MaxSemaphoreSize); err != nil {
			t.Fatalf("Release %d: %v (size record %q)", i, err, rdb.Get(ctx, s.keys.Size).Val())
		}
	}
}

// TestSemaphoreScriptsReclaimedHolderIsQueueHead: A's lease has ended (sem_reclaim
// removes it) while A#2, a call of the same holder, heads the queue, then
// a second waiter of A (A#3). Serving starts from the head read before the
// reclaim (k.first) and from the holders read before it (k.held): A#2 must
// be granted its 2 permits anew, not on top of the 2 that ran out, and
// A#3 must see A#2's grant. A regression guard.
func TestSemaphoreScriptsReclaimedHolderIsQueueHead(t *testing.T) {
	p := newDiffPair(t)
	now := diffClock
	rec := func(want, seq int64) string { return fmt.Sprintf("%d:500:%d:%d", now+2000, want, seq) }
	for _, fence := range []bool{false, true} {
		st := diffState(now, "4:2",
			[]diffHolder{{"app/c1-1", "2:5", -1}, {"app/c2-1", "2:1", 5000}},
			[]diffWaiter{{"app/c1-1#2", rec(2, 6)}, {"app/c1-1#3", rec(1, 7)}, {"app/c3-1#1", rec(1, 1)}})
		// B releases: the queue is served from the freed and the reclaimed permits.
		end := diffSame(t, p, st, diffRel("app/c2-1", 2, 2, 2, "release", "", 4, fence))
		if !strings.Contains(end, "app/c1-1=3:7") {
			t.Errorf("fence %v: want A holding 3 permits (2 + 1) with call number 7:\n%s", fence, end)
		}
		// A#2's own attempt serves the queue.
		diffSame(t, p, st, diffAcq("app/c1-1", 2, 4, 0, 8, "queue", "app/c1-1#2", true, fence))
		// A resize serves it too.
		diffSame(t, p, st, diffOp{kind: "resize", from: 4, to: 5})
		// A#2 withdraws: A#3 is served in its place.
		diffSame(t, p, st, diffRel("app/c1-1", 2, 0, 8, "withdraw", "app/c1-1#2", 4, fence))
	}
}

// TestSemaphoreScriptsReleaseRewritesTheHeadsRecord: a release that empties A
// rewrites the call number in the record of A's queued call (ARGV[6]),
// which heads the queue; the grant that follows must carry the new number
// (sem_release drops k.first), else a retry of the release would be taken
// for a new call. A regression guard.
func TestSemaphoreScriptsReleaseRewritesTheHeadsRecord(t *testing.T) {
	p := newDiffPair(t)
	now := diffClock
	st := diffState(now, "2:2",
		[]diffHolder{{"app/c1-1", "2:4", 5000}},
		[]diffWaiter{{"app/c1-1#2", fmt.Sprintf("%d:500:2:3", now+2000)}, {"app/c2-1#1", fmt.Sprintf("%d:500:1:1", now+2000)}})
	end := diffSame(t, p, st,
		diffRel("app/c1-1", 2, 2, 5, "release", "app/c1-1#2", 2, false),
		diffRel("app/c1-1", 2, 2, 5, "release", "app/c1-1#2", 2, false), // a retry of it
	)
	if !strings.Contains(end, "app/c1-1=2:5") {
		t.Errorf("want A#2 granted under call number 5:\n%s", end)
	}
}

// TestSemaphoreScriptsReclaimIsBounded: with 2,500 holders whose lease
// ended, each call reclaims at most 32 of them (their permits count as in
// use until then) and tells its caller to call again at once (reply
// {0, 0}); the calls that follow reclaim the rest, and the queue is served
// in order meanwhile.
func TestSemaphoreScriptsReclaimIsBounded(t *testing.T) {
	p := newDiffPair(t)
	ctx := context.Background()
	now := diffClock
	var hs []diffHolder
	for i := 0; i < 2500; i++ {
		hs = append(hs, diffHolder{fmt.Sprintf("app/x%d-1", i), "1:1", -int64(i%7) - 1})
	}
	hs = append(hs, diffHolder{"app/c1-1", "1:1", 5000})
	rec := fmt.Sprintf("%d:500:1:1", now+2000)
	p.reset(ctx, diffState(now, "3000:2", hs, []diffWaiter{{"app/c2-1#1", rec}, {"app/c3-1#1", rec}}), now)
	ns, k := p.nsCur, p.nsCur.keys
	op := diffAcq("app/c4-1", 2998, 3000, 0, 1, "queue", "app/c4-1#1", false, false)
	calls := 0
	for {
		calls++
		before := p.rdb.ZCard(ctx, k.Expiry).Val()
		reply := op.run(ctx, p.rdb, p.cur, ns)
		if gone := before - p.rdb.ZCard(ctx, k.Expiry).Val(); gone > 32 {
			t.Fatalf("call %d reclaimed %d holders, want at most 32", calls, gone)
		}
		if reply != "[0 0]" {
			if !strings.HasPrefix(reply, "[0 ") {
				t.Fatalf("call %d: %s, want the caller queued", calls, reply)
			}
			break
		}
		if calls > 2500/32+2 {
			t.Fatalf("%d calls and the ended leases are not all reclaimed", calls)
		}
		op.acq.queued = true
	}
	holders := p.rdb.HGetAll(ctx, k.Holders).Val()
	maps.DeleteFunc(holders, func(f, _ string) bool { return f != schema.SemUsedField && slices.Contains(schema.SemFields, f) })
	want := map[string]string{"app/c1-1": "1:1", "app/c2-1": "1:1", "app/c3-1": "1:1", schema.SemUsedField: "3"}
	if !maps.Equal(holders, want) {
		t.Fatalf("holders after %d calls: %v, want %v", calls, holders, want)
	}
	if q := p.rdb.ZRange(ctx, k.Queue, 0, -1).Val(); !slices.Equal(q, []string{"app/c4-1#1"}) {
		t.Fatalf("queue %v, want c4 alone", q)
	}
	t.Logf("2,500 ended leases reclaimed in %d calls", calls)
}

// TestSemaphoreScriptsLateAttemptOfTheHeadKeepsItsPlace: the queue's head is a
// waiter whose own deadline has passed (and its Client has no deadline
// there) when its next attempt comes in. The attempt refreshes its record
// and serving starts from the head that sem_peek read before: unless
// sem_acquire drops k.first, serving takes the head for dead, drops it,
// and the caller, which no longer asks ZSCORE after serving, is told to
// wait with a record out of the queue, which nobody grants. The existing
// tests do not catch that mutation. A regression guard.
func TestSemaphoreScriptsLateAttemptOfTheHeadKeepsItsPlace(t *testing.T) {
	p := newDiffPair(t)
	ctx := context.Background()
	now := diffClock
	for _, ends := range []int64{5000, -1} { // A's lease: running, or ended (the head fits)
		st := diffState(now, "2:2",
			[]diffHolder{{"app/c1-1", "2:3", ends}},
			[]diffWaiter{{"app/c2-1#1", fmt.Sprintf("%d:500:2:1", now-100)}, {"app/c3-1#1", fmt.Sprintf("%d:500:1:1", now+2000)}})
		end := diffSame(t, p, st, diffAcq("app/c2-1", 2, 2, 0, 2, "queue", "app/c2-1#1", true, false))
		if s := diffStranded(ctx, p.rdb, p.nsCur); len(s) > 0 {
			t.Errorf("A's lease ends in %d ms: %v have a record but no place in the queue:\n%s", ends, s, end)
		}
		queued := p.rdb.ZScore(ctx, p.nsCur.keys.Queue, "app/c2-1#1").Err() == nil
		granted := strings.Contains(end, "app/c2-1=2:2")
		if queued == granted {
			t.Errorf("A's lease ends in %d ms: the head should be queued or granted, one of them (queued %v, granted %v):\n%s", ends, queued, granted, end)
		}
	}
}

// TestSemaphoreScriptsHeadDroppedAsDeadJoinsAgain: sem_acquire
// no longer asks ZSCORE after serving; it counts on the record it has just
// refreshed being alive, as it is for every valid heartbeat. Given one
// that has passed already (a negative heartbeat), serving drops the caller
// from the queue's head as dead: the caller must join the queue again, as
// 9826e3b did, and not keep a record out of the queue, which nobody
// grants.
func TestSemaphoreScriptsHeadDroppedAsDeadJoinsAgain(t *testing.T) {
	p := newDiffPair(t)
	ctx := context.Background()
	now := diffClock
	st := diffState(now, "2:2",
		[]diffHolder{{"app/c1-1", "2:3", 5000}},
		[]diffWaiter{{"app/c2-1#1", fmt.Sprintf("%d:500:1:1", now+2000)}})
	op := diffAcq("app/c2-1", 1, 2, 0, 2, "queue", "app/c2-1#1", true, false)
	op.acq.heartbeat = -time.Millisecond
	end := diffSame(t, p, st, op)
	if s := diffStranded(ctx, p.rdb, p.nsCur); len(s) > 0 {
		t.Errorf("%v have a record but no place in the queue:\n%s", s, end)
	}
	if p.rdb.ZScore(ctx, p.nsCur.keys.Queue, "app/c2-1#1").Err() != nil {
		t.Errorf("the caller left the queue:\n%s", end)
	}
}

// A release that empties a holding remembers it: a retry of the release
// answers 1 (applied). With refuse (a call of the holding may still be on
// its way), a late copy of the holding's first acquire takes nothing.
func TestSemaphoreScriptsReleaseRetiresTheHolder(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprint("refuse=", refuse), func(t *testing.T) {
			mr, rdb, _ := newMini(t)
			k := schema.SemaphoreKeys(schema.DefaultPrefix, "s")
			first := semAcquireArgs{holder: "app/c1-1", n: 2, size: 3, seq: 1, lease: time.Minute, mode: "try",
				waiter: "app/c1-1#1", heartbeat: time.Second, grant: time.Second, publish: "PUBLISH"}.call(k)
			if res, err := first.run(ctx, rdb).Int64Slice(); err != nil || res[0] != 1 {
				t.Fatalf("acquire: %v, %v", res, err)
			}
			release := semReleaseArgs{holder: "app/c1-1", n: 2, held: 2, seq: 2, mode: "release", lease: time.Minute,
				size: 3, publish: "PUBLISH", refuse: refuse}.call(k)
			for i := range 2 { // the release, then its retry
				if res, err := release.run(ctx, rdb).Int64(); err != nil || res != 1 {
					t.Fatalf("release %d: %v, %v; want 1", i, res, err)
				}
			}
			if got := holderFields(t, mr, k.Holders); len(got) != 0 {
				t.Fatalf("holders %v after the release", got)
			}
			res, err := first.run(ctx, rdb).Int64Slice() // a late copy of the first acquire
			if err != nil {
				t.Fatal(err)
			}
			if refuse && res[0] != -3 {
				t.Fatalf("a late copy of the first acquire: %v; want it refused, {-3}", res)
			}
			if !refuse && res[0] != 1 {
				// No copy can be on its way: the id is not refused, and
				// the released zset is not read.
				t.Fatalf("the first acquire again: %v; want it granted", res)
			}
		})
	}
}

// A reclaim that stops at its bound (32 ended leases) forgets the records
// it read, but not those it removed: the caller's, or the queue's head's,
// among them is counted out once. Counted twice, {used} fell short, and a
// semaphore granted more than its size, a RWMutex a write beside a read.
func TestSemaphoreScriptsBoundedReclaimCountsOnce(t *testing.T) {
	p := newDiffPair(t)
	ctx := context.Background()
	ended := func(caller string, permits int) []diffHolder {
		var hs []diffHolder
		for i := range 31 {
			hs = append(hs, diffHolder{fmt.Sprintf("app/x%d-1", i), "1:1", -int64(i) - 2})
		}
		return append(hs, diffHolder{caller, fmt.Sprintf("%d:1", permits), -1})
	}
	t.Run("semaphore", func(t *testing.T) {
		hs := append(ended("app/cx-1", 2), diffHolder{"app/cl-1", "5:1", 50000})
		diffSame(t, p, diffState(diffClock, "70:2", hs, nil),
			diffAcq("app/cx-1", 1, 70, 2, 2, "try", "app/cx-1#2", false, false),  // its lease ended: lost
			diffAcq("app/cy-1", 67, 70, 0, 1, "try", "app/cy-1#1", false, false)) // 5 of 70 in use
		if used := diffUsed(p.rdb.HGetAll(ctx, p.nsCur.keys.Holders).Val()); used > 70 {
			t.Fatalf("the records hold %d permits of 70", used)
		}
	})
	t.Run("rwmutex", func(t *testing.T) {
		size := int64(schema.RWMutexSize)
		hs := append(ended("app/cx-1", 1), diffHolder{"app/cl-1", "1:1", 50000}) // a live read
		diffSame(t, p, diffState(diffClock, fmt.Sprintf("%d:2", size), hs, nil),
			diffRel("app/cx-1", 1, 1, 2, "release", "", size, true),
			diffAcq("app/cw-1", size, size, 0, 1, "try", "app/cw-1#1", false, true))
		if h := p.rdb.HGetAll(ctx, p.nsCur.keys.Holders).Val(); h["app/cw-1"] != "" {
			t.Fatalf("a write granted beside a live read: %v", h)
		}
	})
}

// A waiters hash that a heartbeat makes (renew.lua, "swait") lives as long
// as the semaphore's other keys: a join that does not read it (a first
// attempt that finds every permit in use) counts on it having a TTL.
func TestSemaphoreScriptsWaitersLiveAsLongAsTheState(t *testing.T) {
	rdb := redistest.Client(t)
	k := schema.SemaphoreKeys(schema.DefaultPrefix, redistest.Name(t))
	acquire := func(holder string, n int64) {
		t.Helper()
		if err := (semAcquireArgs{holder: holder, n: n, size: 2, seq: 1, lease: time.Minute, mode: "queue", waiter: holder + "#1",
			heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"}).call(k).run(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
	acquire("app/a-1", 1) // holds one permit of two
	if err := renewCall([]watchdog.Renewal{{Kind: "swait", Owner: "b", TTL: 100 * time.Millisecond, Keys: swaitRenewKeys(k)}}).run(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	acquire("app/c-1", 2) // queued, into the waiters hash the heartbeat made
	state, waiters := rdb.PTTL(ctx, k.Holders).Val(), rdb.PTTL(ctx, k.Waiters).Val()
	if state < time.Hour || waiters < state-time.Second {
		t.Fatalf("waiters hash PTTL %v, the state's %v: want as long (an hour at least)", waiters, state)
	}
}
