package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestExitCodeFlags: --busy-exit, --timeout-exit and --lost-exit replace
// redisync's own codes 73, 75 and 76, so that a script tells them from
// the command's; the command's own 73 still passes through.
func TestExitCodeFlags(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	holdLock(t, name)
	cases := []struct {
		what string
		args []string
		code int
	}{
		{"taken", []string{"lock", "-n", "--busy-exit", "200", name, "--", "true"}, 200},
		{"--wait ran out", []string{"lock", "--wait", "200ms", "--timeout-exit", "201", name, "--", "true"}, 201},
		{"the command's own 73", []string{"lock", "--busy-exit", "200", uniqueName(t), "--", "sh", "-c", "exit 73"}, 73},
	}
	for _, c := range cases {
		if code, p := runCode(t, addr, c.args...); code != c.code {
			t.Errorf("%s: %q: exit %d, want %d; stderr %q", c.what, c.args, code, c.code, p.stderr.String())
		}
	}
	holdSem(t, name, 1)
	if code, p := runCode(t, addr, "sem", "--limit", "1", "-n", "--busy-exit", "202", name, "--", "true"); code != 202 {
		t.Errorf("sem -n --busy-exit 202 on a full semaphore: exit %d, stderr %q", code, p.stderr.String())
	}

	// Lost while the command runs, and while held without a command.
	ready := filepath.Join(t.TempDir(), "ready")
	for _, cmd := range [][]string{{"sh", "-c", loopScript, ready, "exit 0"}, nil} {
		lost := uniqueName(t)
		args := []string{"lock", "--lost-exit", "203", "--watchdog-lease", "300ms", "--grace", "300ms", lost}
		if cmd != nil {
			args = append(append(args, "--"), cmd...)
		}
		p := start(t, addr, args...)
		waitFor(t, "the lock to be held", func() bool {
			if cmd != nil {
				return fileHas(ready, "ready") || p.exited()
			}
			return strings.Contains(p.stdout.String(), "\n") || p.exited()
		})
		if err := redistest.Client(t).Del(context.Background(), schema.LockKeys("redisync", lost).Hash).Err(); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t); code != 203 {
			t.Errorf("lost with --lost-exit 203 (command %q): exit %d, stderr %q", cmd, code, p.stderr.String())
		}
	}
}

// holdSem takes n permits of the semaphore name of size n through the
// library; they are released when the test ends.
func holdSem(t *testing.T, name string, n int64) {
	t.Helper()
	c, err := redisync.New(redistest.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := must(c.NewSemaphore(name, n))
	if err := s.Acquire(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Release(context.Background(), n) })
}

// TestExitCodeFlagsValidated: an exit code outside [1, 255], one of
// redisync's own (64, 69, 70, 126, 127) or a signal's (129-192) is a
// usage error, on every command that takes one; the help lists the flags.
func TestExitCodeFlagsValidated(t *testing.T) {
	for _, cmd := range [][]string{{"lock"}, {"sem", "--limit", "1"}, {"elect"}} {
		for _, flag := range []string{"busy-exit", "timeout-exit", "lost-exit"} {
			for _, v := range []string{"0", "256", "-1", "x", "64", "69", "70", "126", "127", "129", "143", "192"} {
				args := append(append([]string{}, cmd...), "--"+flag, v, "x", "--", "true")
				code, p := runCode(t, "", args...)
				if code != exitUsage || !strings.Contains(p.stderr.String(), "--"+flag+" "+v) {
					t.Errorf("%q: exit %d, stderr %q; want %d and the flag named", args, code, p.stderr.String(), exitUsage)
				}
			}
		}
		_, p := runCode(t, "", cmd[0], "--help")
		for _, flag := range []string{"-busy-exit code", "-timeout-exit code", "-lost-exit code"} {
			if !strings.Contains(p.stdout.String(), flag) {
				t.Errorf("%s --help does not list %s", cmd[0], flag)
			}
		}
	}
	_, p := runCode(t, "", "help")
	if out := p.stdout.String(); !strings.Contains(out, "--busy-exit N, --timeout-exit N and --lost-exit N") {
		t.Errorf("redisync help does not document the exit code flags:\n%s", out)
	}
}

// TestNumericFlagMessages: a numeric flag out of its range is a usage
// error that names the flag and says what is wrong with its value,
// before any connection to Redis.
func TestNumericFlagMessages(t *testing.T) {
	cases := []struct {
		args   []string
		stderr string
	}{
		{[]string{"sem", "--limit", "0", "x", "--", "true"}, "--limit 0 must be at least 1"},
		{[]string{"sem", "--limit", "-3", "x", "--", "true"}, "--limit -3 must be at least 1"},
		{[]string{"sem", "x", "--", "true"}, "missing --limit N"},
		{[]string{"sem", "--limit", "1099511627777", "x", "--", "true"}, "--limit 1099511627777 must be at most 1099511627776"},
		{[]string{"sem", "--limit", "2", "--permits", "0", "x", "--", "true"}, "--permits 0 must be in [1, --limit 2]"},
		{[]string{"sem", "--limit", "2", "--resize", "0", "x"}, "--resize 0 must be at least 1"},
		{[]string{"sem", "--limit", "2", "--resize", "3", "x", "--", "true"}, "--resize takes no command"},
		{[]string{"lock", "--watchdog-lease", "0", "x", "--", "true"}, "--watchdog-lease 0s must be in [3ms, 24h0m0s]"},
		{[]string{"elect", "--heartbeat", "1ms", "x", "--", "true"}, "--heartbeat 1ms must be in [3ms, 24h0m0s]"},
		{[]string{"sem", "--limit", "1", "--lease", "1000h", "x", "--", "true"}, "--lease 1000h0m0s must be in [1ms, 24h0m0s]"},
		{[]string{"lock", "--grace", "-1s", "x", "--", "true"}, "--grace -1s is negative"},
		{[]string{"status", "--interval", "0", "x"}, "--interval 0s is shorter than 10ms"},
		{[]string{"demo", "--clients", "0"}, "--clients 0 must be in [1, 64]"},
	}
	for _, c := range cases {
		code, p := runCode(t, "", c.args...)
		if s := p.stderr.String(); code != exitUsage || !strings.Contains(s, c.stderr) || strings.Contains(s, "cannot acquire") {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", c.args, code, s, exitUsage, c.stderr)
		}
	}
}
