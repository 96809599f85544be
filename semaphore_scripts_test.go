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

// semFaults are the faults that putWrongType plants, by name: a key of
// the semaphore (the suffix after the hash's name; "" is the hash) that is
// of the wrong type, or one of the hash's own fields that holds what
// redisync does not write there.
var semFaults = map[string]string{
	"hash": "", "expiry": ":expiry", "queue": ":queue", "ended": ":ended",
	"size field": "{size}", "token field": "{token}",
}

// putWrongType plants the fault what (see semFaults): a key replaced by a
// list (with a TTL, as redisync's keys have), or a field of the hash set
// to "x"; and it adds to the ended zset an entry whose time is over, so
// that the script's prune of the ended zset is a real write.
func putWrongType(t *testing.T, mr *miniredis.Miniredis, k schema.Semaphore, what string) {
	t.Helper()
	if _, err := mr.ZAdd(k.Ended, 1, "old:1"); err != nil {
		t.Fatal(err)
	}
	mr.SetTTL(k.Ended, time.Minute)
	if strings.HasPrefix(what, "{") {
		mr.HSet(k.Hash, what, "x")
		return
	}
	key := k.Hash + what
	mr.Del(key)
	mr.Lpush(key, "x")
	mr.SetTTL(key, time.Minute)
}

// A release (partial, granting the queue's head) or a withdrawal that
// meets a fault (see semFaults) fails having written nothing, even when it
// has a stale entry of the ended zset to prune: the prune must follow
// every read (the expiry zset's is sem_reclaim's; the ended zset is
// written by a withdrawal, not by a partial release).
func TestSemaphoreScriptsReleaseWithAPruneMeetingWrongTypeWritesNothing(t *testing.T) {
	for _, mode := range []string{"release", "withdraw"} {
		for fault, what := range semFaults {
			t.Run(mode+"/"+fault, func(t *testing.T) {
				mr, rdb, k := fullSemWithWaiter(t)
				putWrongType(t, mr, k, what)
				before := mr.Dump()
				rel := semReleaseArgs{holder: "A", n: 1, held: 3, seq: 2, mode: "release", lease: time.Minute, size: 3, publish: "PUBLISH"}
				if mode == "withdraw" {
					rel = semReleaseArgs{holder: "B", n: 1, held: 0, seq: 2, mode: "withdraw", waiter: "B#1", lease: time.Minute, size: 3, publish: "PUBLISH"}
				}
				err := rel.call(k).run(ctx, rdb).Err()
				if fault == "ended" && mode == "release" {
					// A partial release does not touch the ended zset.
					if err != nil {
						t.Fatalf("release: %v, want success", err)
					}
					if l, _ := mr.List(k.Ended); !slices.Equal(l, []string{"x"}) {
						t.Fatalf("release wrote the ended key: %v", l)
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
				if _, err := mr.ZAdd(k.Ended, 1, "old:1"); err != nil {
					t.Fatal(err)
				}
				mr.SetTTL(k.Ended, time.Minute)
				mr.HSet(k.Hash, "E", "1:1")
				if _, err := mr.ZAdd(k.Expiry, 1, "E"); err != nil { // an ended lease
					t.Fatal(err)
				}
				switch junk {
				case "own":
					mr.HSet(k.Hash, c.holder, "junk")
				case "ended":
					mr.HSet(k.Hash, "E", "junk")
				default:
					mr.HSet(k.Hash, "Z", "junk")
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
					if v := mr.HGet(k.Hash, "Z"); v != "junk" {
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
// fault (see semFaults) fails having written nothing, even with an ended
// lease to reclaim first (TestSemaphoreWrongTypeIsAnErrorAndWritesNothing
// runs on an empty semaphore, where nothing comes before the checks). The
// ended zset is read only while it may refuse something (a withdrawal or
// a retired holder in the last minutes): here the call does not touch it.
func TestSemaphoreScriptsAcquireWithAReclaimMeetingWrongTypeWritesNothing(t *testing.T) {
	attempts := map[string]semAcquireArgs{
		"queue":  {holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"try":    {holder: "C", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "try", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"later":  {holder: "B", n: 1, size: 3, seq: 1, lease: time.Minute, mode: "queue", waiter: "B#1", queued: true, heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
		"resize": {holder: "C", n: 1, size: 4, seq: 1, lease: time.Minute, mode: "queue", waiter: "C#1", heartbeat: 3 * time.Second, grant: 3 * time.Second, publish: "PUBLISH"},
	}
	for name, a := range attempts {
		for fault, what := range semFaults {
			t.Run(name+"/"+fault, func(t *testing.T) {
				mr, rdb, k := fullSemWithWaiter(t)
				mr.HSet(k.Hash, "E", "1:1")
				if _, err := mr.ZAdd(k.Expiry, 1, "E"); err != nil { // an ended lease
					t.Fatal(err)
				}
				putWrongType(t, mr, k, what)
				before := mr.Dump()
				err := a.call(k).run(ctx, rdb).Err()
				if err == nil && fault == "ended" {
					if l, _ := mr.List(k.Ended); !slices.Equal(l, []string{"x"}) {
						t.Fatalf("acquire wrote the ended key: %v", l)
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

// The semaphore scripts read the holders once (sem_open) and
// the queue head once (sem_peek), and sem_serve reports whether it stopped
// at a live waiter. The tests here run today's scripts
// and those of the reference (copied into testdata/semaphore-9826e3b) side by side, on a
// real Redis, from the same states with the same arguments and the same
// server clock, and require the same replies, the same state afterwards
// and the same messages published: the change was to read less, and to
// keep the state in fewer keys, not to behave otherwise. A later change
// that means to change what the semaphore scripts do updates the copy, or
// these tests, with it.

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

// diffVersions returns the scripts of the reference (testdata/semaphore-9826e3b, a copy)
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
	// The worktree's scripts publish with PUBLISH or SPUBLISH (lib.lua,
	// publish_cmd); here with RPUSH, as the reference is told to: the
	// messages land in a list named after the channel, which the states
	// compare.
	lib := diffReplace(t, diffClocked(t, luaLib), "return 'PUBLISH'", "return 'RPUSH'")
	cur = diffScripts{"new",
		testScript(lib + luaSemLib + luaSemAcquire),
		testScript(lib + luaSemLib + luaSemRelease),
		testScript(lib + luaSemLib + luaSemResize)}
	return old, cur
}

// diffKeys are a semaphore's keys in the layout of the reference's scripts
// (layout 2: testdata/semaphore-9826e3b/sem_lib.lua), eight keys, and the
// prefix of its grant channels.
type diffKeys struct {
	// Holders is a hash of holder id -> "permits:seq".
	Holders string
	// Expiry is a zset of holder id -> the end of its lease (ms).
	Expiry string
	// Size is a string, "size:2".
	Size string
	// Queue is a zset of waiter id -> when it joined (µs).
	Queue string
	// Waiters is a hash of waiter id -> "deadline:lease:permits:seq", and
	// of "{client}id" -> a Client's deadline.
	Waiters string
	// Released is a zset of "holder:seq" and "holder" -> the ms until
	// which a release that emptied the holder is remembered.
	Released string
	// Withdrawn is a zset of waiter id -> the ms of its withdrawal.
	Withdrawn string
	// Token is a RWMutex's last fencing token, a string.
	Token   string
	Channel string
}

// diffKeysOf returns the keys in the reference's layout of the semaphore
// whose keys in the worktree's layout are k: the same names where the
// layouts share a key (the hash of holders, the expiry zset, the queue).
func diffKeysOf(k schema.Semaphore) diffKeys {
	b := k.Hash
	return diffKeys{Holders: b, Expiry: b + ":expiry", Size: b + ":size", Queue: b + ":queue", Waiters: b + ":waiters",
		Released: b + ":released", Withdrawn: b + ":withdrawn", Token: b + ":token", Channel: k.Channel}
}

// acquire returns the reference's sem_acquire.lua call with the arguments
// a (see its header); the caller sets the script.
func (k diffKeys) acquire(a semAcquireArgs) scriptCall {
	return scriptCall{nil,
		[]string{k.Holders, k.Expiry, k.Size, k.Queue, k.Waiters, k.Withdrawn, k.Released, k.Token},
		[]any{a.holder, a.n, a.size, a.held, a.seq, a.lease.Milliseconds(), a.mode, a.waiter, flag(a.queued),
			a.heartbeat.Milliseconds(), a.grant.Milliseconds(), k.Channel, a.publish, flag(a.fence)}}
}

// release returns the reference's sem_release.lua call with the
// arguments a.
func (k diffKeys) release(a semReleaseArgs) scriptCall {
	return scriptCall{nil,
		[]string{k.Holders, k.Expiry, k.Queue, k.Waiters, k.Released, k.Withdrawn, k.Size, k.Token},
		[]any{a.holder, a.n, a.held, a.seq, a.mode, a.waiter, a.lease.Milliseconds(), a.size,
			tombstoneTTL.Milliseconds(), k.Channel, a.publish, flag(a.fence), flag(a.refuse)}}
}

// resize returns the reference's sem_resize.lua call from the size from
// to the size to.
func (k diffKeys) resize(from, to int64, publish string) scriptCall {
	return scriptCall{nil, []string{k.Holders, k.Expiry, k.Size, k.Queue, k.Waiters}, []any{from, to, k.Channel, publish}}
}

// diffNS is one namespace of keys on the shared Redis. The tests write
// their states in the reference's layout (2, keys old); in the worktree's
// namespace (cur) the state is then carried over to the worktree's layout
// (schema.SemLayout, keys keys: migrate), and a dump of it reads as one of
// the reference's (dump).
type diffNS struct {
	prefix string
	keys   schema.Semaphore
	old    diffKeys
	clock  string
	cur    bool
}

// diffRecord matches a holder record: permits, then the call number.
var diffRecord = regexp.MustCompile(`^(\d+):\d+$`)

// diffWaiterID matches a waiter id, which ends with '#' and digits (a
// holder id never does).
var diffWaiterID = regexp.MustCompile(`#\d+$`)

// diffWithdrawnMs is how long a withdrawn call is refused (withdrawn_ms in
// both versions): the worktree's ended zset scores a withdrawn call by the
// end of that time, the reference's withdrawn zset by its start.
const diffWithdrawnMs = 120_000

// diffTTL returns the TTL to give to a key made of the keys keys: the
// longest of theirs, 0 when one of them has none, -1 when none of them
// exists.
func diffTTL(ctx context.Context, rdb *redis.Client, keys ...string) time.Duration {
	ttl := time.Duration(-1)
	for _, key := range keys {
		switch d := rdb.PTTL(ctx, key).Val(); {
		case d == -1 || ttl == 0 && d >= 0:
			ttl = 0
		case d > ttl && ttl != 0:
			ttl = d
		}
	}
	return ttl
}

// migrate turns a state written in layout 2 (the reference's keys) into
// the worktree's layout. The hash takes the holders' records, the
// waiters' records and the Clients' deadlines, and the semaphore's own
// fields: the count of the permits in use; the size record (in layout 5;
// a size without a layout, layout 1's, as "size:1"; one that is not a
// size as it is, "x" for a key of the wrong type); the last fencing token
// (as it is, "x" for a key of the wrong type); the time until which every
// key lives (the least TTL: none when a key has none); and the times
// until which the ended zset may refuse an id. The ended zset takes the
// released zset's entries as they are and the withdrawn zset's scored by
// the end of their refusal. A holders or waiters key of the wrong type
// makes a hash of the wrong type; a released or withdrawn key of the
// wrong type an ended key of that type. The reference's other keys go.
func (ns diffNS) migrate(ctx context.Context, rdb *redis.Client) {
	o, k := ns.old, ns.keys
	now := ns.now(ctx, rdb)
	typ := func(key string) string { return rdb.Type(ctx, key).Val() }
	own := map[string]any{}
	fields := map[string]string{}
	var wrongHash, wrongEnded string // the type of a key of the wrong type, or ""
	for _, key := range []string{o.Holders, o.Waiters} {
		switch t := typ(key); t {
		case "hash":
			maps.Copy(fields, rdb.HGetAll(ctx, key).Val())
		case "none":
		default:
			wrongHash = t
		}
	}
	if used := diffUsed(rdb.HGetAll(ctx, o.Holders).Val()); used > 0 {
		own[schema.SemUsedField] = fmt.Sprintf("%d:%d", used, schema.SemLayout)
	}
	switch typ(o.Size) {
	case "none":
	case "string":
		v := rdb.Get(ctx, o.Size).Val()
		switch n, layout, ok := strings.Cut(v, ":"); {
		case ok && layout == "2" && diffDigits(n):
			own["{size}"] = n + ":" + strconv.Itoa(schema.SemLayout)
		case !ok && diffDigits(v):
			own["{size}"] = v + ":1"
		default:
			own["{size}"] = v
		}
	default:
		own["{size}"] = "x"
	}
	switch typ(o.Token) {
	case "none":
	case "string":
		own["{token}"] = rdb.Get(ctx, o.Token).Val()
	default:
		own["{token}"] = "x"
	}
	least := time.Duration(-1)
	for _, key := range []string{o.Holders, o.Expiry, o.Size, o.Queue, o.Waiters} {
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
	var ended []redis.Z
	switch t := typ(o.Released); t {
	case "zset":
		for _, z := range rdb.ZRangeWithScores(ctx, o.Released, 0, -1).Val() {
			ended = append(ended, z)
			if m := fmt.Sprint(z.Member); !strings.Contains(m, ":") && int64(z.Score) > now {
				own["{gone}"] = max(int64(z.Score), toInt(own["{gone}"]))
			}
		}
	case "none":
	default:
		wrongEnded = t
	}
	switch t := typ(o.Withdrawn); t {
	case "zset":
		for _, z := range rdb.ZRangeWithScores(ctx, o.Withdrawn, 0, -1).Val() {
			z.Score += diffWithdrawnMs
			ended = append(ended, z)
			own["{refuse}"] = max(int64(z.Score), toInt(own["{refuse}"]))
		}
	case "none":
	default:
		wrongEnded = t
	}
	hashTTL := diffTTL(ctx, rdb, o.Holders, o.Waiters, o.Size, o.Token)
	endedTTL := diffTTL(ctx, rdb, o.Released, o.Withdrawn)
	if hashTTL < 0 && least > 0 {
		hashTTL = least // the hash holds only fields it makes
	} else if hashTTL < 0 {
		hashTTL = endedTTL
	}
	rdb.Del(ctx, k.Hash, o.Size, o.Waiters, o.Released, o.Withdrawn, o.Token, k.Ended)
	expire := func(key string, ttl time.Duration) {
		if ttl > 0 {
			rdb.PExpire(ctx, key, ttl)
		}
	}
	switch {
	case wrongHash == "list":
		rdb.RPush(ctx, k.Hash, "x")
	case wrongHash != "":
		rdb.Set(ctx, k.Hash, "x", 0)
	case len(fields) > 0 || len(own) > 0:
		for f, v := range fields {
			own[f] = v
		}
		rdb.HSet(ctx, k.Hash, own)
	}
	expire(k.Hash, hashTTL)
	switch {
	case wrongEnded == "list":
		rdb.RPush(ctx, k.Ended, "x")
	case wrongEnded != "":
		rdb.Set(ctx, k.Ended, "x", 0)
	case len(ended) > 0:
		rdb.ZAdd(ctx, k.Ended, ended...)
	}
	expire(k.Ended, endedTTL)
}

// diffDigits reports whether s is a decimal number.
func diffDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
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

// diffUsed sums the permits of the holder records in h (a holders hash
// of either layout).
func diffUsed(h map[string]string) (used int64) {
	for f, v := range h {
		if m := diffRecord.FindStringSubmatch(v); m != nil && schema.SemHolderField(f) {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			used += n
		}
	}
	return used
}

func diffNamespace(prefix string) diffNS {
	k := schema.SemaphoreKeys(prefix, "r21")
	return diffNS{prefix: prefix, keys: k, old: diffKeysOf(k), clock: k.Hash + ":clock", cur: prefix == "r21new"}
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

// storedSize returns the size stored in the namespace (the size key in
// the reference's layout, the {size} field in the worktree's), if one is.
func (ns diffNS) storedSize(ctx context.Context, rdb *redis.Client) (int64, bool) {
	var v string
	var err error
	if ns.cur {
		v, err = rdb.HGet(ctx, ns.keys.Hash, "{size}").Result()
	} else {
		v, err = rdb.Get(ctx, ns.old.Size).Result()
	}
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.Split(v, ":")[0], 10, 64)
	return n, err == nil && n > 0
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

// run runs op with the scripts sc in the namespace ns (the worktree's
// call in the worktree's namespace, the reference's own keys and
// arguments in the reference's) and returns its reply, normalized (error
// text without script names or line numbers, and without the namespace's
// prefix).
func (op diffOp) run(ctx context.Context, rdb *redis.Client, sc diffScripts, ns diffNS) string {
	var c scriptCall
	switch op.kind {
	case "acquire":
		a := op.acq
		a.publish = "RPUSH" // messages land in a list named after the channel
		// The caller's size is the stored one, and n no more than it: the
		// reference refuses another size, where the worktree's script
		// works with the stored one and refuses n above it.
		if stored, ok := ns.storedSize(ctx, rdb); ok {
			a.size, a.n = stored, min(a.n, stored)
		}
		// An attempt of a call that may have queued it says so (ARGV[9]):
		// the worktree's script looks for the waiter in the queue only
		// then.
		if rdb.ZScore(ctx, ns.keys.Queue, a.waiter).Err() == nil {
			a.queued = true
		}
		if ns.cur {
			c = a.call(ns.keys)
		} else {
			c = ns.old.acquire(a)
		}
		c.script = sc.acquire
	case "release":
		r := op.rel
		r.publish = "RPUSH"
		// The reference refuses the id of every holding a release ends;
		// the worktree's, of those whose calls may still be on their way.
		r.refuse = true
		if ns.cur {
			c = r.call(ns.keys)
		} else {
			c = ns.old.release(r)
		}
		c.script = sc.release
	default:
		if ns.cur {
			c = semResizeArgs{from: op.from, to: op.to, publish: "RPUSH"}.call(ns.keys)
		} else {
			c = ns.old.resize(op.from, op.to, "RPUSH")
		}
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

// dump returns the state of the namespace (but its clock) as text in the
// reference's layout: every key with its type and value, with the TTLs
// (in ms, by key; a key without one has none) apart. The worktree's hash
// reads as the reference's holders hash (the holder records), waiters
// hash (the waiter records and the Clients' deadlines), size key ({size},
// layout 5 read as 2) and token key ({token}), each with the hash's TTL;
// its ended zset as the released zset (the entries that are no waiter
// ids) and the withdrawn zset (the waiter ids, scored by the start of
// their refusal), with its TTL; the worktree's {used} is checked against
// the records. Entries whose time is over, of the released and withdrawn
// zsets, are left out (the versions prune them at different calls), as is
// a key left with no entry, and the released zset's TTL.
func (ns diffNS) dump(ctx context.Context, rdb *redis.Client) (string, map[string]int64) {
	keys, err := rdb.Keys(ctx, ns.prefix+":*").Result()
	if err != nil {
		panic(err)
	}
	now := ns.now(ctx, rdb)
	o := ns.old
	lines := map[string]string{}
	ttls := map[string]int64{}
	// put records the key named key, of type typ, with its entries and
	// TTL (< 0: none).
	put := func(key, typ string, entries []string, ttl time.Duration) {
		if len(entries) == 0 {
			return
		}
		name := strings.Replace(key, ns.prefix, "P", 1)
		lines[name] = fmt.Sprintf("%s (%s): %s", name, typ, strings.Join(entries, " "))
		if ttl >= 0 && key != o.Released {
			ttls[name] = ttl.Milliseconds()
		}
	}
	fieldsOf := func(m map[string]string) (out []string) {
		for _, f := range slices.Sorted(maps.Keys(m)) {
			out = append(out, f+"="+m[f])
		}
		return out
	}
	// zsetOf returns the entries of a released (withdrawn false) or
	// withdrawn zset that are remembered at now, each scored as the
	// reference's zset scores it: shift is what to add to the score read.
	zsetOf := func(zs []redis.Z, withdrawn bool, shift float64) (out []string) {
		for _, z := range zs {
			score := z.Score + shift
			if until := score + map[bool]float64{false: 0, true: diffWithdrawnMs}[withdrawn]; int64(until) <= now {
				continue // forgotten: pruned now or later
			}
			out = append(out, fmt.Sprintf("%v=%.0f", z.Member, score))
		}
		return out
	}
	for _, key := range keys {
		if key == ns.clock {
			continue
		}
		typ := rdb.Type(ctx, key).Val()
		ttl := rdb.PTTL(ctx, key).Val()
		switch {
		case ns.cur && key == ns.keys.Hash && typ == "hash":
			m := rdb.HGetAll(ctx, key).Val()
			var check []string
			if want, got := diffUsed(m), m[schema.SemUsedField]; got != fmt.Sprintf("%d:%d", want, schema.SemLayout) && (want > 0 || got != "") {
				check = append(check, fmt.Sprintf("[%s is %q, the records hold %d]", schema.SemUsedField, got, want))
			}
			holders, waiters := map[string]string{}, map[string]string{}
			for f, v := range m {
				switch {
				case slices.Contains(schema.SemFields, f):
				case schema.SemHolderField(f):
					holders[f] = v
				default:
					waiters[f] = v
				}
			}
			put(o.Holders, "hash", append(check, fieldsOf(holders)...), ttl)
			put(o.Waiters, "hash", fieldsOf(waiters), ttl)
			if v, ok := m["{size}"]; ok {
				if n, layout, ok := strings.Cut(v, ":"); ok && layout == strconv.Itoa(schema.SemLayout) {
					v = n + ":2"
				} else if ok && layout == "1" {
					v = n // layout 1's size has no layout
				}
				put(o.Size, "string", []string{v}, ttl)
			}
			if v, ok := m["{token}"]; ok {
				put(o.Token, "string", []string{v}, ttl)
			}
		case ns.cur && key == ns.keys.Ended && typ == "zset":
			var released, withdrawn []redis.Z
			for _, z := range rdb.ZRangeWithScores(ctx, key, 0, -1).Val() {
				if diffWaiterID.MatchString(fmt.Sprint(z.Member)) {
					withdrawn = append(withdrawn, z)
				} else {
					released = append(released, z)
				}
			}
			put(o.Released, "zset", zsetOf(released, false, 0), ttl)
			put(o.Withdrawn, "zset", zsetOf(withdrawn, true, -diffWithdrawnMs), ttl)
		case ns.cur && key == ns.keys.Ended:
			v := diffValue(ctx, rdb, key, typ)
			put(o.Released, typ, v, ttl)
			put(o.Withdrawn, typ, v, ttl)
		case key == o.Released || key == o.Withdrawn:
			if typ != "zset" {
				put(key, typ, diffValue(ctx, rdb, key, typ), ttl)
				break
			}
			put(key, typ, zsetOf(rdb.ZRangeWithScores(ctx, key, 0, -1).Val(), key == o.Withdrawn, 0), ttl)
		case typ == "hash":
			put(key, typ, fieldsOf(rdb.HGetAll(ctx, key).Val()), ttl)
		default:
			put(key, typ, diffValue(ctx, rdb, key, typ), ttl)
		}
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(lines)) {
		b.WriteString(lines[name])
		b.WriteString("\n")
	}
	return strings.ReplaceAll(b.String(), ns.prefix, "P"), ttls
}

// diffValue returns the value of a key of type typ other than a hash, as
// dump shows it.
func diffValue(ctx context.Context, rdb *redis.Client, key, typ string) []string {
	switch typ {
	case "string":
		return []string{rdb.Get(ctx, key).Val()}
	case "zset":
		var out []string
		for _, z := range rdb.ZRangeWithScores(ctx, key, 0, -1).Val() {
			out = append(out, fmt.Sprintf("%v=%.0f", z.Member, z.Score))
		}
		return out
	case "list":
		return []string{strings.Join(rdb.LRange(ctx, key, 0, -1).Val(), " | ")}
	}
	return []string{"?"}
}

// diffWorld builds random states and calls from a small universe of ids.
type diffWorld struct {
	rng   *rand.Rand
	size  int64
	fence bool
	now   int64
	// garbage is the chance of a garbage value or a key of the wrong type
	garbage float64
	// wrong names the one key of the wrong type, if any: a key of the
	// reference's layout (diffKeys), or "ended", the released and the
	// withdrawn zsets both (the worktree's ended zset)
	wrong string
}

var diffHolders = []string{"app/c1-1", "app/c1-2", "app/c2-1", "app/c3-1"}

func (w *diffWorld) holder() string { return diffHolders[w.rng.Intn(len(diffHolders))] }

func (w *diffWorld) waiterOf(holder string) string {
	return holder + "#" + strconv.Itoa(1+w.rng.Intn(3))
}

func (w *diffWorld) chance(p float64) bool { return w.rng.Float64() < p }

func (w *diffWorld) between(lo, hi int64) int64 { return lo + w.rng.Int63n(hi-lo+1) }

// diffWrite is one command that builds a state in the reference's layout.
type diffWrite func(ctx context.Context, rdb *redis.Client, k diffKeys)

// state returns the writes of a random state, the same in any namespace.
func (w *diffWorld) state() (ws []diffWrite) {
	add := func(f diffWrite) { ws = append(ws, f) }
	hset := func(key func(k diffKeys) string, field, value string) {
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.HSet(ctx, key(k), field, value) })
	}
	zadd := func(key func(k diffKeys) string, member string, score int64) {
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) {
			rdb.ZAdd(ctx, key(k), redis.Z{Score: float64(score), Member: member})
		})
	}
	wrongType := func(key func(k diffKeys) string, asString bool) {
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) {
			if asString {
				rdb.Set(ctx, key(k), "x", 0)
			} else {
				rdb.RPush(ctx, key(k), "x")
			}
		})
	}
	holders := func(k diffKeys) string { return k.Holders }
	expiry := func(k diffKeys) string { return k.Expiry }
	queue := func(k diffKeys) string { return k.Queue }
	waiters := func(k diffKeys) string { return k.Waiters }
	released := func(k diffKeys) string { return k.Released }
	withdrawn := func(k diffKeys) string { return k.Withdrawn }
	size := func(k diffKeys) string { return k.Size }
	token := func(k diffKeys) string { return k.Token }
	g := w.garbage
	if w.wrong != "" {
		g = 0
		defer func() {
			key := w.wrong
			ws = append(ws, func(ctx context.Context, rdb *redis.Client, k diffKeys) {
				diffPlantWrong(ctx, rdb, k, key)
			})
		}()
	}

	// size
	switch r := w.rng.Float64(); {
	case r < g:
		wrongType(size, false)
	case r < 2*g:
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.Set(ctx, k.Size, "x:y", 0) })
	case r < 0.05:
	case r < 0.08:
		s := fmt.Sprint(w.size)
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.Set(ctx, k.Size, s, 0) })
	case r < 0.11:
		s := fmt.Sprintf("%d:2", w.size+1)
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.Set(ctx, k.Size, s, 0) })
	default:
		s := fmt.Sprintf("%d:2", w.size)
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.Set(ctx, k.Size, s, 0) })
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
	// released and withdrawn calls (the worktree keeps both in its ended
	// zset: one of the wrong type is both)
	if w.chance(g) {
		wrongType(released, true)
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
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.Set(ctx, k.Token, "x", 0) })
	case r < 0.5:
		v := w.now*1000 - w.between(0, 5_000_000)
		add(func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.Set(ctx, k.Token, v, 0) })
	}
	// TTLs: most keys have one
	ttl := time.Duration(w.between(5, 3600)) * time.Second
	noTTL := w.chance(0.2)
	add(func(ctx context.Context, rdb *redis.Client, k diffKeys) {
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
// state in ns, a namespace of the reference's layout (what a live caller sends): held is what the holder holds,
// seq follows the holder's, a queued waiter says it is queued.
func (w *diffWorld) informed(ctx context.Context, rdb *redis.Client, ns diffNS) diffOp {
	op := w.op()
	held := map[string][2]int64{}
	if m, err := rdb.HGetAll(ctx, ns.old.Holders).Result(); err == nil {
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
			f(ctx, p.rdb, ns.old)
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

// untouched reports whether the worktree's key named wrong ("ended" or
// "queue", the keys that a call may not need) is of the wrong type, as
// the tests set it.
func (p *diffPair) untouched(ctx context.Context, wrong string) bool {
	key := map[string]string{"ended": p.nsCur.keys.Ended, "queue": p.nsCur.keys.Queue}[wrong]
	switch p.rdb.Type(ctx, key).Val() {
	case "string":
		return p.rdb.Get(ctx, key).Val() == "x"
	case "list":
		return slices.Equal(p.rdb.LRange(ctx, key, 0, -1).Val(), []string{"x"})
	}
	return false
}

// diffPlantWrong makes the key named wrong (a field of diffKeys in lower
// case, or "ended": the released and the withdrawn zsets) of the wrong
// type in the reference's layout: a list for the size and the token (read
// with GET), a string for the others.
func diffPlantWrong(ctx context.Context, rdb *redis.Client, k diffKeys, wrong string) {
	keys := map[string][]string{"holders": {k.Holders}, "expiry": {k.Expiry}, "size": {k.Size}, "queue": {k.Queue},
		"waiters": {k.Waiters}, "ended": {k.Released, k.Withdrawn}, "token": {k.Token}}[wrong]
	for _, key := range keys {
		rdb.Del(ctx, key)
		if wrong == "size" || wrong == "token" {
			rdb.RPush(ctx, key, "x")
		} else {
			rdb.Set(ctx, key, "x", 0)
		}
		rdb.PExpire(ctx, key, time.Hour)
	}
}

// untimed returns the keys of the namespace (but its clock and the
// lists of published messages) that have no TTL.
func (ns diffNS) untimed(ctx context.Context, rdb *redis.Client) map[string]bool {
	out := map[string]bool{}
	for _, key := range rdb.Keys(ctx, ns.prefix+":*").Val() {
		if key != ns.clock && !strings.HasPrefix(key, ns.keys.Channel) && rdb.PTTL(ctx, key).Val() == -1 {
			out[key] = true
		}
	}
	return out
}

// step runs op in both namespaces and returns the replies and states;
// diff, "" or a description of how they differ; and parted, "" or why
// the states part by design at this step (the layouts differ there, see
// parts): then diff is "", and a test compares them no further.
func (p *diffPair) step(ctx context.Context, op diffOp) (oldReply, curReply, oldState, curState, diff, parted string) {
	before, _ := p.nsCur.dump(ctx, p.rdb)
	untimed := p.nsCur.untimed(ctx, p.rdb)
	oldReply = op.run(ctx, p.rdb, p.old, p.nsOld)
	curReply = op.run(ctx, p.rdb, p.cur, p.nsCur)
	if op.kind == "acquire" && oldReply == "[-4 0]" && curReply == oldReply {
		// The worktree's call that ends its waiter id (it left the
		// queue) removes the waiter's record, which may be left out of
		// the queue; the reference's leaves it to its waiters hash's TTL.
		p.rdb.HDel(ctx, p.nsOld.old.Waiters, op.acq.waiter)
	}
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
	case diffFault(oldReply) && diffFault(curReply) && curState == before:
		// A state with faults: each version fails having written
		// nothing (the versions may read them in another order, and
		// keep what they fail on in other keys).
	case oldReply != curReply:
		diff = "replies differ"
	case oldState != curState:
		diff = "states differ"
	default:
		// The worktree's keys live at least as long as the reference's
		// (it pushes their TTLs out ahead of need, see sem_lib.lua,
		// sem_keep): the keys where the worktree keeps the same data
		// (see dump).
		for k, a := range oldTTL {
			if b, ok := curTTL[k]; !ok || a-b > 200 {
				diff = fmt.Sprintf("TTL of %s is shorter: %d ms, the reference's %d ms", k, b, a)
			}
		}
	}
	if diff == "replies differ" || diff == "states differ" {
		if parted = p.parts(ctx, oldReply, curReply); parted != "" {
			diff = ""
		}
	}
	// Every key the worktree's call leaves has a TTL, unless the state
	// held it without one.
	for key := range p.nsCur.untimed(ctx, p.rdb) {
		if !untimed[key] && diff == "" {
			diff = "the new script left " + key + " without a TTL"
		}
	}
	return
}

// parts returns why the versions' replies may differ by design, after
// which their states part; or "":
//   - the reference failed on a key of the wrong type that the
//     worktree's call did not need (the ended zset, read only while it may
//     refuse something; the queue, read only when it may be served), and
//     the worktree's call left that key as it was;
//   - the worktree's call failed on a {token} field that is not an
//     integer, which it reads in every call (sem_open: all of the hash's
//     own fields), where the reference reads its token key only in a
//     RWMutex's acquire and release;
//   - one version failed on a size of another layout (layout 1's, without
//     a layout) and the other did not: the reference refuses it while the
//     semaphore has a holder record or a waiter, the worktree while a
//     lease runs.
//
// A worktree's call that failed having written is told by step first.
func (p *diffPair) parts(ctx context.Context, oldReply, curReply string) string {
	curFailed := strings.HasPrefix(curReply, "error")
	switch {
	case strings.Contains(oldReply, "WRONGTYPE") && !curFailed && (p.untouched(ctx, "ended") || p.untouched(ctx, "queue")):
		return "the new call did not need the key of the wrong type"
	case curFailed && strings.Contains(curReply, "does not hold a semaphore of this layout") && !diffFault(oldReply) &&
		!p.tokenIsInteger(ctx):
		return "the {token} field is not an integer: the new call reads it whatever it does"
	case strings.Contains(oldReply, "LAYOUT") != strings.Contains(curReply, "LAYOUT"):
		return "the versions tell a semaphore of another layout in use by other signs"
	}
	return ""
}

// tokenIsInteger reports whether the worktree's {token} field is absent
// or an integer, as redisync writes it.
func (p *diffPair) tokenIsInteger(ctx context.Context) bool {
	v, err := p.rdb.HGet(ctx, p.nsCur.keys.Hash, "{token}").Result()
	if err != nil {
		return errors.Is(err, redis.Nil)
	}
	_, err = strconv.ParseInt(v, 10, 64)
	return err == nil
}

// diffState returns writes that build a state (in the reference's layout)
// from simple descriptions:
// holders "id" -> "permits:seq" with their lease end (ms from now), and
// the queue in order with each waiter's record.
type diffHolder struct {
	id, rec string
	ends    int64 // ms from now
}

type diffWaiter struct{ id, rec string }

func diffState(now int64, size string, hs []diffHolder, q []diffWaiter) []diffWrite {
	return []diffWrite{func(ctx context.Context, c *redis.Client, k diffKeys) {
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
		or, cr, os, cs, diff, parted := p.step(ctx, op)
		if parted != "" {
			diff = "the versions part: " + parted
		}
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

// diffStranded returns the waiter ids that have a record in the hash of
// ns, a namespace of the worktree's layout, but no place in its queue:
// nobody grants them.
func diffStranded(ctx context.Context, rdb *redis.Client, ns diffNS) []string {
	var out []string
	for f := range rdb.HGetAll(ctx, ns.keys.Hash).Val() {
		if strings.HasPrefix(f, "{") || schema.SemHolderField(f) {
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
			w.wrong = diffWrongKeys[rng.Intn(len(diffWrongKeys))]
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
			or, cr, os, cs, diff, parted := p.step(ctx, op)
			log = append(log, "  old: "+or, "  new: "+cr)
			key := op.kind + " " + cr
			if strings.HasPrefix(cr, "error") {
				key = op.kind + " error"
			} else if op.kind == "acquire" {
				key = op.kind + " " + strings.SplitN(strings.Trim(cr, "[]"), " ", 2)[0]
			}
			stats[key]++
			if parted != "" {
				// The layouts differ here by design (see parts): the
				// states part.
				stats["parted: "+parted]++
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

// diffWrongKeys name the keys of the reference's layout that a test makes
// of the wrong type (see diffPlantWrong), and so the worktree's faults
// (migrate): a holders or a waiters key makes a hash of the wrong type;
// "ended" (the released and the withdrawn zsets) an ended zset of the
// wrong type; a size or a token key a {size} or {token} field that holds
// "x".
var diffWrongKeys = []string{"holders", "expiry", "size", "queue", "waiters", "ended", "token"}

// TestSemaphoreScriptsWrongTypeFailsBeforeWriting puts one key of the wrong type
// (see diffWrongKeys) in a few states (an empty queue among them) and
// runs each kind of call: a call that fails must have changed nothing,
// and the reference's scripts must answer the same, but where the
// layouts differ by design (see parts). A regression guard.
func TestSemaphoreScriptsWrongTypeFailsBeforeWriting(t *testing.T) {
	ctx := context.Background()
	p := newDiffPair(t)
	now := diffClock
	const size = 2
	lease := func(h string, ms int64) diffWrite {
		return func(ctx context.Context, rdb *redis.Client, k diffKeys) {
			rdb.ZAdd(ctx, k.Expiry, redis.Z{Score: float64(now + ms), Member: h})
		}
	}
	hset := func(key func(diffKeys) string, f, v string) diffWrite {
		return func(ctx context.Context, rdb *redis.Client, k diffKeys) { rdb.HSet(ctx, key(k), f, v) }
	}
	holders := func(k diffKeys) string { return k.Holders }
	waiters := func(k diffKeys) string { return k.Waiters }
	sizeKey := func(ctx context.Context, rdb *redis.Client, k diffKeys) {
		rdb.Set(ctx, k.Size, "2:2", time.Hour)
	}
	states := map[string][]diffWrite{
		"idle":                {sizeKey},
		"full, nobody queued": {sizeKey, hset(holders, "app/c1-1", "2:3"), lease("app/c1-1", 5000)},
		"half, one queued": {sizeKey, hset(holders, "app/c1-1", "1:3"), lease("app/c1-1", 5000),
			func(ctx context.Context, rdb *redis.Client, k diffKeys) {
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
	for _, wrong := range diffWrongKeys {
		for name, st := range states {
			for _, fence := range []bool{false, true} {
				for _, op := range ops(fence) {
					ws := append(slices.Clone(st), func(ctx context.Context, rdb *redis.Client, k diffKeys) {
						diffPlantWrong(ctx, rdb, k, wrong)
					})
					p.reset(ctx, ws, now)
					or, cr, os, cs, diff, parted := p.step(ctx, op)
					if parted != "" {
						// The worktree's call did not need the key of
						// the wrong type (the ended zset is read only
						// while it may refuse something), or reads the
						// {token} field that the reference's call did
						// not need (see parts).
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
	if n := rdb.Exists(ctx, schema.SemaphoreKeys("r21big", "big").Hash).Val(); n != 0 {
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
			t.Fatalf("Release %d: %v (size record %q)", i, err, rdb.HGet(ctx, s.keys.Hash, "{size}").Val())
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
	holders := p.rdb.HGetAll(ctx, k.Hash).Val()
	maps.DeleteFunc(holders, func(f, _ string) bool { return f != schema.SemUsedField && !schema.SemHolderField(f) })
	want := map[string]string{"app/c1-1": "1:1", "app/c2-1": "1:1", "app/c3-1": "1:1", schema.SemUsedField: "3:" + strconv.Itoa(schema.SemLayout)}
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

// TestSemaphoreScriptsHeadWithTheLeastHeartbeatKeepsItsPlace: sem_acquire
// does not ask ZSCORE after serving; it counts on the record it has just
// refreshed being alive, as it is for every heartbeat the script takes:
// the least, 0, makes a deadline of now, which is alive. The caller that
// heads the queue stays there, with its record, as in the reference. A
// heartbeat below 0, with which the reference's serving dropped the
// caller as dead, fails the call (LIMIT) before it writes anything.
func TestSemaphoreScriptsHeadWithTheLeastHeartbeatKeepsItsPlace(t *testing.T) {
	p := newDiffPair(t)
	ctx := context.Background()
	now := diffClock
	st := diffState(now, "2:2",
		[]diffHolder{{"app/c1-1", "2:3", 5000}},
		[]diffWaiter{{"app/c2-1#1", fmt.Sprintf("%d:500:1:1", now+2000)}})
	op := diffAcq("app/c2-1", 1, 2, 0, 2, "queue", "app/c2-1#1", true, false)
	op.acq.heartbeat = 0
	end := diffSame(t, p, st, op)
	if s := diffStranded(ctx, p.rdb, p.nsCur); len(s) > 0 {
		t.Errorf("%v have a record but no place in the queue:\n%s", s, end)
	}
	if p.rdb.ZScore(ctx, p.nsCur.keys.Queue, "app/c2-1#1").Err() != nil {
		t.Errorf("the caller left the queue:\n%s", end)
	}

	p.reset(ctx, st, now)
	before, _ := p.nsCur.dump(ctx, p.rdb)
	op.acq.heartbeat = -time.Millisecond
	if reply := op.run(ctx, p.rdb, p.cur, p.nsCur); !strings.Contains(reply, "LIMIT") {
		t.Errorf("a heartbeat of -1 ms: %s, want a LIMIT error", reply)
	}
	if after, _ := p.nsCur.dump(ctx, p.rdb); after != before {
		t.Errorf("the call with a heartbeat of -1 ms wrote:\nbefore:\n%s\nafter:\n%s", before, after)
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
			if got := holderFields(t, mr, k.Hash); len(got) != 0 {
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
				// the ended zset is not read.
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
		if used := diffUsed(p.rdb.HGetAll(ctx, p.nsCur.keys.Hash).Val()); used > 70 {
			t.Fatalf("the records hold %d permits of 70", used)
		}
	})
	t.Run("rwmutex", func(t *testing.T) {
		size := int64(schema.RWMutexSize)
		hs := append(ended("app/cx-1", 1), diffHolder{"app/cl-1", "1:1", 50000}) // a live read
		diffSame(t, p, diffState(diffClock, fmt.Sprintf("%d:2", size), hs, nil),
			diffRel("app/cx-1", 1, 1, 2, "release", "", size, true),
			diffAcq("app/cw-1", size, size, 0, 1, "try", "app/cw-1#1", false, true))
		if h := p.rdb.HGetAll(ctx, p.nsCur.keys.Hash).Val(); h["app/cw-1"] != "" {
			t.Fatalf("a write granted beside a live read: %v", h)
		}
	})
}

// A queue that a join makes lives as long as the semaphore's other keys:
// the hash, which a heartbeat of the semaphore's waiters (renew.lua,
// "swait") wrote the Client's deadline into and gave its TTL, and the
// expiry zset. The join (a first attempt that finds every permit in use)
// makes the queue.
func TestSemaphoreScriptsQueueLivesAsLongAsTheState(t *testing.T) {
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
	if err := renewCall([]watchdog.Renewal{{Kind: "swait", Owner: "b", TTL: 100 * time.Millisecond, Keys: semKeys(k)}}).run(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	if !rdb.HExists(ctx, k.Hash, "{client}b").Val() {
		t.Fatalf("the heartbeat wrote no deadline: %v", rdb.HGetAll(ctx, k.Hash).Val())
	}
	acquire("app/c-1", 2) // queued: the queue is made
	state := rdb.PTTL(ctx, k.Hash).Val()
	if state < time.Hour {
		t.Fatalf("hash PTTL %v: want an hour at least", state)
	}
	for _, key := range []string{k.Expiry, k.Queue} {
		if ttl := rdb.PTTL(ctx, key).Val(); ttl < state-time.Second {
			t.Fatalf("%s PTTL %v, the hash's %v: want as long", key, ttl, state)
		}
	}
}
