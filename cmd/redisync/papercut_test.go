package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version"} {
		code, p := runCode(t, "", arg)
		if code != 0 || !strings.HasPrefix(p.stdout.String(), "redisync ") || !strings.Contains(p.stdout.String(), " go1.") {
			t.Errorf("%s: exit %d, stdout %q", arg, code, p.stdout.String())
		}
	}
}

func TestDurationFlags(t *testing.T) {
	cases := []struct{ value, stderr string }{
		{"5", "--wait 5: missing unit, e.g. 5s"},
		{"1.5", "--wait 1.5: missing unit, e.g. 1.5s"},
		{"soon", "--wait soon: not a duration"},
	}
	for _, c := range cases {
		code, p := runCode(t, "", "lock", "--wait", c.value, "x", "--", "true")
		if code != exitUsage || !strings.Contains(p.stderr.String(), c.stderr) {
			t.Errorf("--wait %s: exit %d, stderr %q; want %d and %q", c.value, code, p.stderr.String(), exitUsage, c.stderr)
		}
	}
	if code, p := runCode(t, "", "sem", "--limit", "four", "x", "--", "true"); code != exitUsage || !strings.Contains(p.stderr.String(), "--limit four: not a number") {
		t.Errorf("--limit four: exit %d, stderr %q", code, p.stderr.String())
	}
	for _, cmd := range []string{"lock", "sem", "demo"} {
		_, p := runCode(t, "", cmd, "--help")
		if out := p.stdout.String(); strings.Contains(out, " long\n") || !strings.Contains(out, " duration\n") {
			t.Errorf("%s --help shows duration flags as:\n%s", cmd, out)
		}
	}
}

func TestNoWait(t *testing.T) {
	addr := redistest.Addr(t)
	name, ran := uniqueName(t), filepath.Join(t.TempDir(), "ran")
	if code, p := runCode(t, addr, "lock", "-n", name, "--", "true"); code != 0 {
		t.Errorf("-n on a free lock: exit %d, stderr %q", code, p.stderr.String())
	}
	holdLock(t, name)
	for _, flag := range []string{"-n", "--no-wait"} {
		code, p := runCode(t, addr, "lock", flag, name, "--", "touch", ran)
		if code != exitBusy || !strings.Contains(p.stderr.String(), "is taken (--no-wait)") {
			t.Errorf("%s on a held lock: exit %d, stderr %q; want %d", flag, code, p.stderr.String(), exitBusy)
		}
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran without the lock")
	}

	c, err := redisync.New(redistest.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	sem := must(c.NewSemaphore(name, 1))
	if err := sem.Acquire(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Release(context.Background(), 1) })
	if code, p := runCode(t, addr, "sem", "--limit", "1", "-n", name, "--", "touch", ran); code != exitBusy {
		t.Errorf("sem -n on a full semaphore: exit %d, stderr %q; want %d", code, p.stderr.String(), exitBusy)
	}
	if code, p := runCode(t, addr, "lock", "-n", "--wait", "1s", name, "--", "true"); code != exitUsage {
		t.Errorf("-n with --wait: exit %d, stderr %q; want %d", code, p.stderr.String(), exitUsage)
	}
}

func TestHoldWithoutCommand(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	key := schema.LockKeys("redisync", name).Hash
	p := start(t, addr, "lock", name)
	waitFor(t, "the lock to be held", func() bool { return strings.Contains(p.stdout.String(), "\n") || p.exited() })
	token := redistest.NewClient(t, addr).HGet(context.Background(), schema.LockKeys("redisync", name).Hash, schema.TokenField).Val()
	if out := p.stdout.String(); token == "" || out != key+" "+token+"\n" {
		t.Fatalf("stdout %q, want %q; stderr %q", out, key+" "+token+"\n", p.stderr.String())
	}
	if code, _ := runCode(t, addr, "lock", "-n", name, "--", "true"); code != exitBusy {
		t.Errorf("another lock -n: exit %d, want %d", code, exitBusy)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Errorf("exit %d on SIGTERM, want 0; stderr %q", code, p.stderr.String())
	}
	if len(holdIDs(t, redistest.Client(t), key)) != 0 {
		t.Error("the lock is still held after redisync exited")
	}
}

func TestStatusShowsWhatExists(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	code, p := runCode(t, addr, "status", name)
	if out := p.stdout.String(); code != exitFree || !strings.Contains(out, `lock "`+name) || strings.Contains(out, "semaphore") {
		t.Errorf("nothing: exit %d, stdout %q; want %d and the free lock alone", code, out, exitFree)
	}
	c, err := redisync.New(redistest.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	sem := must(c.NewSemaphore(name, 2))
	if err := sem.Acquire(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	code, p = runCode(t, addr, "status", name)
	if out := p.stdout.String(); code != 0 || !strings.HasPrefix(out, `semaphore "`+name) || strings.Contains(out, "lock") {
		t.Errorf("a semaphore: exit %d, stdout %q; want 0 and the semaphore alone", code, out)
	}
	if err := sem.Release(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if code, p = runCode(t, addr, "status", name); code != exitFree {
		t.Errorf("a free semaphore: exit %d, stdout %q; want %d", code, p.stdout.String(), exitFree)
	}
}

func TestVerboseSaysWhoHolds(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	holdLock(t, name)
	owner := holdIDs(t, redistest.Client(t), schema.LockKeys("redisync", name).Hash)
	code, p := runCode(t, addr, "lock", "--verbose", "--wait", "200ms", name, "--", "true")
	if code != exitTimeout || len(owner) != 1 || !strings.Contains(p.stderr.String(), "is held by "+owner[0]) {
		t.Errorf("exit %d, stderr %q; want %d and the holder %q", code, p.stderr.String(), exitTimeout, owner)
	}
}
