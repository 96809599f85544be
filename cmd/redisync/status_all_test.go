package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

func TestParseKey(t *testing.T) {
	cases := []struct {
		key  string
		want candidate
		ok   bool
	}{
		{"p:lock:{a}", candidate{0, "a"}, true},
		{"p:lock:{a}:waiting", candidate{0, "a"}, true},
		{"p:lock:{a}:queue", candidate{}, false},
		{"p:lock:{a}:bargers", candidate{0, "a"}, true},
		{"p:lock:{a}:token", candidate{}, false},
		{"p:lock:{a}:released:host/1/uuid-1", candidate{}, false},
		{"p:sem:{x:y}z}", candidate{1, "x:y}z"}, true},
		{"p:sem:{g}:bargers", candidate{}, false},
		{"p:rw:{r}:queue", candidate{2, "r"}, true},
		{"p:elect:{e}", candidate{3, "e"}, true},
		{"p:elect:{e}:rev", candidate{}, false},
		{"p:elect:{e}:waiting", candidate{3, "e"}, true},
		{"q:lock:{a}", candidate{}, false},
		{"p:lock:{}", candidate{}, false},
		{"p:other:{a}", candidate{}, false},
	}
	for _, c := range cases {
		if got, ok := parseKey("p", c.key); got != c.want || ok != c.ok {
			t.Errorf("parseKey(%q) = %v, %v; want %v, %v", c.key, got, ok, c.want, c.ok)
		}
	}
}

// TestStatusAll: status --all lists every lock, semaphore,
// read-write lock and election under the prefix that is held or waited
// for, by kind and name, and none that is free; --limit cuts the list.
func TestStatusAll(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := fmt.Sprintf("all%d-%d", os.Getpid(), nameSeq.Add(1))
	c, err := redisync.New(redistest.Client(t), redisync.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	held := map[string]*redisync.Mutex{}
	for _, name := range []string{"held", "queued", "x:y}z"} {
		m := must(c.NewMutex(name))
		check(m.Lock(ctx))
		t.Cleanup(func() { _ = m.Unlock(context.Background()) })
		held[name] = m
	}
	free := must(c.NewMutex("free")) // leaves its token behind
	check(free.Lock(ctx))
	check(free.Unlock(ctx))
	waiter := start(t, addr, "lock", "--prefix", prefix, "queued", "--", "true")
	waitFor(t, "the waiter to queue", func() bool {
		return redistest.Client(t).LLen(ctx, schema.LockKeys(prefix, "queued").Queue).Val() == 1 || waiter.exited()
	})
	for _, s := range []struct {
		name    string
		size, n int64
	}{{"gpus", 3, 2}, {"full", 1, 1}} {
		sem := must(c.NewSemaphore(s.name, s.size))
		check(sem.Acquire(ctx, s.n))
		t.Cleanup(func() { _ = sem.Release(context.Background(), s.n) })
	}
	rw := must(c.NewRWMutex("rw"))
	check(rw.RLock(ctx))
	t.Cleanup(func() { _ = rw.RUnlock(context.Background()) })
	e := must(c.NewElection("boss"))
	check(e.Campaign(ctx, "v1"))
	t.Cleanup(func() { _ = e.Resign(context.Background()) })
	// A key that looks like a lock's, of a name that redisync refuses.
	stray := prefix + ":lock:{}x}"
	rdb := redistest.Client(t)
	check(rdb.Set(ctx, stray, "?", time.Minute).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), stray) })
	// Another program's key where a lock's hash would be: listed with
	// its error, and the listing goes on.
	foreign := prefix + ":lock:{foreign}"
	check(rdb.Set(ctx, foreign, "?", time.Minute).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), foreign) })

	listing := func(args ...string) *Listing {
		t.Helper()
		code, p := runCode(t, addr, append([]string{"status", "--all", "--prefix", prefix, "--json"}, args...)...)
		var l Listing
		if err := json.Unmarshal([]byte(p.stdout.String()), &l); err != nil || code != exitOK {
			t.Fatalf("status %q: exit %d, %v: %s %s", args, code, err, p.stdout.String(), p.stderr.String())
		}
		return &l
	}
	l := listing()
	var got []string
	for _, e := range l.Entries {
		got = append(got, e.Kind+" "+e.Name)
	}
	want := []string{"lock foreign", "lock held", "lock queued", "lock x:y}z", "semaphore full", "semaphore gpus", "rwmutex rw", "election boss"}
	if !slices.Equal(got, want) || l.More || l.Prefix != prefix {
		t.Fatalf("listed %q (more %v), want %q", got, l.More, want)
	}
	host, _ := os.Hostname()
	for _, e := range l.Entries {
		if e.Error != "" {
			continue
		}
		if len(e.Holders) != 1 || e.Holders[0].Label != fmt.Sprintf("%s/%d", host, os.Getpid()) {
			t.Errorf("%s %s: holders %+v, want the test's process", e.Kind, e.Name, e.Holders)
		}
	}
	byName := func(name string) Entry {
		i := slices.IndexFunc(l.Entries, func(e Entry) bool { return e.Name == name })
		return l.Entries[i]
	}
	if f := byName("foreign"); !strings.Contains(f.Error, "wrong type") || len(f.Holders) != 0 {
		t.Errorf("foreign: %+v, want an error that names a wrong type", f)
	}
	if q := byName("queued"); q.Waiting != 1 {
		t.Errorf("queued: %+v, want 1 waiting", q)
	}
	if f := byName("full"); f.Size == nil || *f.Size != 1 || f.Available == nil || *f.Available != 0 || f.Holders[0].Permits != 1 {
		t.Errorf("full: %+v, want size 1, 0 available, 1 permit held", f)
	}
	if b := byName("boss"); b.Holders[0].Value != "v1" {
		t.Errorf("boss: %+v, want the leader's value v1", b)
	}

	if l := listing("--limit", "3"); len(l.Entries) != 3 || !l.More || l.Entries[2].Name != "queued" {
		t.Errorf("--limit 3: %+v, want the first 3 and more", l)
	}
	code, p := runCode(t, addr, "status", "--all", "--prefix", prefix)
	if out := p.stdout.String(); code != exitOK || !strings.Contains(out, `semaphore  "gpus"`) || !strings.Contains(out, "1 of 3 free") ||
		strings.Contains(out, `"free"`) {
		t.Errorf("status --all: exit %d, stdout:\n%s", code, out)
	}
	code, p = runCode(t, addr, "status", "--all", "--prefix", prefix+"-none")
	if code != exitOK || !strings.Contains(p.stdout.String(), "nothing held or waited for") {
		t.Errorf("status of an empty prefix: exit %d, stdout %q", code, p.stdout.String())
	}
	// No NAME without --all is a usage error: a script's empty $NAME
	// must not read as "held".
	for _, args := range [][]string{{}, {"--json"}, {"--all", "x"}, {"--all", "--watch"}, {"--limit", "2", "x"}, {"--all", "--limit", "-1"}} {
		if code, p := runCode(t, addr, append([]string{"status"}, args...)...); code != exitUsage {
			t.Errorf("status %q: exit %d, want %d; stderr %q", args, code, exitUsage, p.stderr.String())
		}
	}
	check(held["queued"].Unlock(ctx))
	if code := waiter.wait(t); code != 0 {
		t.Errorf("the waiter: exit %d, stderr %q", code, waiter.stderr.String())
	}
}

// statusAllOnCluster: status --all finds what every primary of the
// cluster holds.
func statusAllOnCluster(t *testing.T, cl *redistest.Cluster) {
	crdb := cl.NewClient(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("all%d-%d", os.Getpid(), nameSeq.Add(1))
	c, err := redisync.New(crdb, redisync.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	served := map[string]bool{}
	var names []string
	for i := 0; len(served) < 3; i++ {
		name := fmt.Sprintf("n%d", i)
		if srv := cl.PrimaryFor(t, crdb, schema.LockKeys(prefix, name).Hash).Addr; !served[srv] {
			served[srv] = true
			names = append(names, name)
			m := must(c.NewMutex(name))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Unlock(context.Background()) })
		}
	}
	l, err := listStatus(ctx, crdb, prefix, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range l.Entries {
		got = append(got, e.Name)
	}
	slices.Sort(names)
	if !slices.Equal(got, names) {
		t.Errorf("listed %q on a cluster, want %q, one held on each primary", got, names)
	}
}
