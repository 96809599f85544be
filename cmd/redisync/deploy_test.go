package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestCluster runs lock and status against a 3-primary Redis Cluster,
// named by one node (found to be a cluster node) or by a list of seeds:
// every name works, whichever node serves its slot.
func TestCluster(t *testing.T) {
	cl := redistest.SpawnCluster(t, 3, 0)
	crdb := cl.NewClient(t)
	nodes := cl.Addrs()
	ctx := context.Background()

	// Names until every primary serves one.
	served := map[string]bool{}
	var names []string
	for i := 0; len(served) < 3; i++ {
		name := fmt.Sprintf("%s-%d", uniqueName(t), i)
		srv := cl.PrimaryFor(t, crdb, schema.LockKeys("redisync", name).Hash)
		if !served[srv.Addr] {
			served[srv.Addr] = true
			names = append(names, name)
		}
	}
	last := map[string]int64{} // the token of each name's last run
	for _, spec := range []string{nodes[0], "redis://" + nodes[1], strings.Join(nodes, ",")} {
		for _, name := range names {
			code, p := runCode(t, "", "lock", "--redis", spec, name, "--", "sh", "-c", `echo "$REDISYNC_TOKEN"`)
			tk, err := strconv.ParseInt(strings.TrimSpace(p.stdout.String()), 10, 64)
			if code != 0 || p.stderr.String() != "" || err != nil || tk <= last[name] {
				t.Errorf("--redis %s lock %s: exit %d, token %q after %d, stderr %q", spec, name, code, p.stdout.String(), last[name], p.stderr.String())
			}
			last[name] = tk
		}
	}
	for _, name := range names {
		if tk, _ := crdb.HGet(ctx, schema.LockKeys("redisync", name).Hash, schema.TokenField).Int64(); tk != last[name] {
			t.Errorf("%s: token counter %d, want the last run's %d", name, tk, last[name])
		}
	}

	// Held by the test: status shows the holder, and a lock with a short
	// --wait times out.
	c, err := redisync.New(crdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, name := range names {
		m := must(c.NewMutex(name))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		owner := holdIDs(t, crdb, schema.LockKeys("redisync", name).Hash)
		code, p := runCode(t, "", "status", "--redis", nodes[0], name)
		if code != 0 || len(owner) != 1 || !strings.Contains(p.stdout.String(), owner[0]) {
			t.Errorf("status %s: exit %d, stdout %q, stderr %q; want the holder %q", name, code, p.stdout.String(), p.stderr.String(), owner)
		}
		code, p = runCode(t, "", "lock", "--redis", nodes[2], "--wait", "200ms", name, "--", "true")
		if code != exitTimeout {
			t.Errorf("lock %s while held: exit %d, stderr %q; want %d", name, code, p.stderr.String(), exitTimeout)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	code, p := runCode(t, "", "lock", "--redis", "redis://"+nodes[0]+"/2", names[0], "--", "true")
	if code != exitUnavailable || !strings.Contains(p.stderr.String(), "SELECT is not allowed in cluster mode") {
		t.Errorf("a database on a cluster: exit %d, stderr %q; want %d", code, p.stderr.String(), exitUnavailable)
	}
}

// TestSentinel runs lock and status on the primary that a Sentinel names,
// with no go-redis log lines on stderr.
func TestSentinel(t *testing.T) {
	primary := redistest.Spawn(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.Spawn(t)
	ctx := context.Background()
	host, port, _ := strings.Cut(primary.Addr, ":")
	if err := redistest.NewClient(t, replica.Addr).ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	var sentinels []string
	for range 2 {
		sentinels = append(sentinels, redistest.SpawnSentinel(t, "mymaster", primary.Addr).Addr)
	}
	spec := "redis+sentinel://" + strings.Join(sentinels, ",") + "/mymaster"
	name := uniqueName(t)
	code, p := runCode(t, "", "lock", "--redis", spec, name, "--", "sh", "-c", `echo "$REDISYNC_TOKEN"`)
	token := strings.TrimSpace(p.stdout.String())
	if code != 0 || token == "" || p.stderr.String() != "" {
		t.Errorf("lock: exit %d, stdout %q, stderr %q; want 0, a token and nothing on stderr", code, p.stdout.String(), p.stderr.String())
	}
	if tk := redistest.NewClient(t, primary.Addr).HGet(ctx, schema.LockKeys("redisync", name).Hash, schema.TokenField).Val(); tk != token {
		t.Errorf("token on the primary %q, want %q", tk, token)
	}
	code, p = runCode(t, "", "status", "--json", "--redis", spec, name)
	if !strings.Contains(p.stdout.String(), `"last_token": `+token) || p.stderr.String() != "" {
		t.Errorf("status: exit %d, stdout %q, stderr %q", code, p.stdout.String(), p.stderr.String())
	}
	code, p = runCode(t, "", "status", "--redis", strings.Replace(spec, "mymaster", "nosuchmaster", 1), name)
	if code != exitUnavailable || strings.Count(p.stderr.String(), "\n") != 1 || !strings.Contains(p.stderr.String(), `a master named "nosuchmaster"`) {
		t.Errorf("unknown master: exit %d, stderr %q; want %d and one line", code, p.stderr.String(), exitUnavailable)
	}
}
