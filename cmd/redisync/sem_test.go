//go:build redisync_sem

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redisync/redisync/internal/redistest"
)

func init() { buildTags = append(buildTags, "redisync_sem") }

func TestSemLimits(t *testing.T) {
	addr := redistest.Addr(t)
	name, log := uniqueName(t), filepath.Join(t.TempDir(), "log")
	script := `echo "+$1" >> "$0"; sleep 0.05; echo "-$1" >> "$0"`
	var procs []*proc
	for i := range 6 {
		procs = append(procs, start(t, addr, "sem", "--limit", "2", name, "--", "sh", "-c", script, log, fmt.Sprint(i)))
	}
	for _, p := range procs {
		if code := p.wait(t); code != 0 {
			t.Fatalf("exit %d, stderr %q", code, p.stderr.String())
		}
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	inside, most := 0, 0
	for _, l := range strings.Fields(string(b)) {
		if l[0] == '+' {
			inside++
		} else {
			inside--
		}
		most = max(most, inside)
	}
	if most > 2 || len(strings.Fields(string(b))) != 12 {
		t.Errorf("%d commands ran at once with --limit 2:\n%s", most, b)
	}
}

func TestSemUsageAndExit(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	cases := []struct {
		args []string
		code int
	}{
		{[]string{"sem", name, "--", "true"}, exitUsage},
		{[]string{"sem", "--limit", "2", "--permits", "3", name, "--", "true"}, exitUsage},
		{[]string{"sem", "--limit", "2", name, "--", "sh", "-c", "exit 3"}, 3},
	}
	for _, c := range cases {
		if code, p := runCode(t, addr, c.args...); code != c.code {
			t.Errorf("%q: exit %d, want %d; stderr %q", c.args, code, c.code, p.stderr.String())
		}
	}
}

func TestSemStatus(t *testing.T) {
	addr := redistest.Addr(t)
	name, ready := uniqueName(t), filepath.Join(t.TempDir(), "ready")
	p := start(t, addr, "sem", "--limit", "3", "--permits", "2", name, "--", "sh", "-c", loopScript, ready, "exit 0")
	waitFor(t, "the command to start", func() bool { return fileHas(ready, "ready") || p.exited() })
	code, s := runCode(t, addr, "status", "--json", name)
	var st Status
	if err := json.Unmarshal([]byte(s.stdout.String()), &st); code != 0 || err != nil {
		t.Fatalf("exit %d, %v: %s", code, err, s.stdout.String())
	}
	if sem := st.Semaphore; sem == nil || sem.Size != 3 || sem.Available != 1 || len(sem.Holders) != 1 || sem.Holders[0].Permits != 2 {
		t.Errorf("semaphore %+v, want size 3, 1 available, one holder of 2", st.Semaphore)
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
}
