package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestElect: two candidates, one leads and runs its command while the
// other waits; status shows the leader with its value and token, and the
// waiting candidate; when the leader's command ends, the other leads and
// runs its own, with a larger token.
func TestElect(t *testing.T) {
	addr := redistest.Addr(t)
	name, dir := uniqueName(t), t.TempDir()
	readyA, readyB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	a := start(t, addr, "elect", "--value", "A", name, "--", "sh", "-c", loopScript, readyA, "exit 0")
	waitFor(t, "a to lead", func() bool { return fileHas(readyA, "ready") || a.exited() })
	b := start(t, addr, "elect", "--value", "B", name, "--", "sh", "-c", `echo "$REDISYNC_VALUE $REDISYNC_TOKEN" > "$0"`, readyB)
	waitFor(t, "b to wait", func() bool {
		n, _ := redistest.Client(t).LLen(context.Background(), schema.ElectionKeys("redisync", name).Queue).Result()
		return n == 1
	})
	st := electStatus(t, addr, name)
	e := st.Election
	if e == nil || e.Leader == nil || e.Leader.Metadata != "A" || e.Leader.Token == 0 || len(e.Candidates) != 1 || e.Candidates[0].Metadata != "B" {
		t.Fatalf("status %+v, want A leading and B waiting", e)
	}
	code, p := runCode(t, addr, "status", name)
	if out := p.stdout.String(); code != exitOK || !strings.Contains(out, `value          "A"`) || !strings.Contains(out, "election") {
		t.Errorf("status: exit %d, stdout %q", code, out)
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	if code := a.wait(t); code != 0 {
		t.Fatalf("a: exit %d, stderr %q", code, a.stderr.String())
	}
	if code := b.wait(t); code != 0 {
		t.Fatalf("b: exit %d, stderr %q", code, b.stderr.String())
	}
	if !fileHas(readyB, "B ") {
		t.Fatal("b's command did not run with its value")
	}
	last := electStatus(t, addr, name).Election
	if last == nil || last.Leader != nil || last.LastToken <= e.Leader.Token {
		t.Fatalf("after both: %+v, want nobody leading and a token above %d", last, e.Leader.Token)
	}
}

// TestElectLostKillsCommand: a leader whose leadership is lost has its
// command stopped, and exits 76.
func TestElectLostKillsCommand(t *testing.T) {
	addr := redistest.Addr(t)
	name, file := uniqueName(t), filepath.Join(t.TempDir(), "log")
	p := start(t, addr, "elect", "--watchdog-lease", "300ms", "--grace", "300ms", name, "--",
		"sh", "-c", loopScript, file, `echo TERM >> "$0"; exit 0`)
	waitFor(t, "the command to start", func() bool { return fileHas(file, "ready") || p.exited() })
	if err := redistest.Client(t).Del(context.Background(), schema.ElectionKeys("redisync", name).Hash).Err(); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != exitLost {
		t.Errorf("exit %d, want %d; stderr %q", code, exitLost, p.stderr.String())
	}
	if !fileHas(file, "TERM") || !strings.Contains(p.stderr.String(), "was LOST while the command ran") {
		t.Errorf("the command got no SIGTERM, or the loss was not explained: %q", p.stderr.String())
	}
}

// TestElectNoWait: elect -n leads a free election and runs its command;
// while another candidate leads, it exits 73 (or --busy-exit) at once,
// runs nothing and leaves nothing queued.
func TestElectNoWait(t *testing.T) {
	addr := redistest.Addr(t)
	name, dir := uniqueName(t), t.TempDir()
	ran, led := filepath.Join(dir, "ran"), filepath.Join(dir, "led")
	code, p := runCode(t, addr, "elect", "-n", "--value", "first", name, "--", "sh", "-c", `echo "$REDISYNC_VALUE" > "$0"`, led)
	if code != 0 || !fileHas(led, "first") {
		t.Fatalf("elect -n of a free election: exit %d, stderr %q; want 0 and the command run", code, p.stderr.String())
	}
	leader := start(t, addr, "elect", name)
	waitFor(t, "the leader to lead", func() bool { return strings.Contains(leader.stdout.String(), "\n") || leader.exited() })
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"elect", "-n", name, "--", "touch", ran}, exitBusy},
		{[]string{"elect", "--no-wait", "--busy-exit", "200", name, "--", "touch", ran}, 200},
	} {
		code, p := runCode(t, addr, c.args...)
		if code != c.code || !strings.Contains(p.stderr.String(), "is taken (--no-wait)") {
			t.Errorf("%q while another leads: exit %d, stderr %q; want %d", c.args, code, p.stderr.String(), c.code)
		}
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("a command ran without the leadership")
	}
	if n := redistest.Client(t).LLen(context.Background(), schema.ElectionKeys("redisync", name).Queue).Val(); n != 0 {
		t.Errorf("%d candidates queued by elect -n; want none", n)
	}
	if err := leader.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := leader.wait(t); code != 0 {
		t.Errorf("the leader: exit %d, stderr %q", code, leader.stderr.String())
	}
}

func TestElectUsage(t *testing.T) {
	for _, args := range [][]string{{"elect", "-n", "--wait", "1s", "x", "--", "true"}, {"elect", "x", "y"}} {
		if code, p := runCode(t, "", args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d; stderr %q", args, code, exitUsage, p.stderr.String())
		}
	}
}

// electStatus reads "redisync status --json name".
func electStatus(t *testing.T, addr, name string) Status {
	t.Helper()
	_, p := runCode(t, addr, "status", "--json", name)
	var st Status
	if err := json.Unmarshal([]byte(p.stdout.String()), &st); err != nil {
		t.Fatalf("status --json: %v: %q", err, p.stdout.String())
	}
	return st
}
