package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

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
		// The size is stored: another --limit for the same NAME works with
		// the stored size, and more --permits than it are refused.
		{[]string{"sem", "--limit", "3", name, "--", "true"}, 0},
		{[]string{"sem", "--limit", "3", "--permits", "3", name, "--", "true"}, exitUsage},
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
	st := semStatus(t, addr, name)
	if sem := st.Semaphore; sem == nil || sem.Size != 3 || sem.Available != 1 || len(sem.Holders) != 1 ||
		sem.Holders[0].Permits != 2 || sem.Holders[0].LeaseMS <= 0 || len(sem.Queue) != 0 {
		t.Fatalf("semaphore %+v, want size 3, 1 available, one holder of 2 with a lease, no queue", st.Semaphore)
	}
	holder := st.Semaphore.Holders[0].Owner

	// A second process wants 2 permits: it queues behind the holder.
	q := start(t, addr, "sem", "--limit", "3", "--permits", "2", name, "--", "true")
	waitFor(t, "the second process to queue", func() bool {
		sem := semStatus(t, addr, name).Semaphore
		return (sem != nil && len(sem.Queue) == 1) || q.exited()
	})
	st = semStatus(t, addr, name)
	w := st.Semaphore.Queue[0]
	if w.Position != 1 || w.Permits != 2 || !w.Alive || w.HeartbeatMS <= 0 || w.GrantLeaseMS <= 0 ||
		!strings.HasPrefix(w.Waiter, w.Owner+"#") || w.Owner == holder {
		t.Errorf("waiter %+v, want one live waiter for 2 permits, another holder than %s", w, holder)
	}
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	if code := q.wait(t); code != 0 {
		t.Errorf("the queued process: exit %d, stderr %q", code, q.stderr.String())
	}
}

// semStatus runs "redisync status --json name".
func semStatus(t *testing.T, addr, name string) Status {
	t.Helper()
	code, s := runCode(t, addr, "status", "--json", name)
	var st Status
	if err := json.Unmarshal([]byte(s.stdout.String()), &st); (code != 0 && code != exitFree) || err != nil {
		t.Fatalf("status: exit %d, %v: %s", code, err, s.stdout.String())
	}
	return st
}

// Issue 19, point 3: sem --resize changes a semaphore's size in place, if
// it is the size given with --limit.
func TestSemResize(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t)
	name := uniqueName(t)
	key := schema.SemaphoreKeys("redisync", name).Hash
	if code, p := runCode(t, addr, "sem", "--limit", "2", name, "--", "true"); code != 0 {
		t.Fatalf("sem: exit %d, stderr %q", code, p.stderr.String())
	}
	code, p := runCode(t, addr, "sem", "--limit", "2", "--resize", "3", name)
	if code != 0 || !strings.Contains(p.stdout.String(), "3 permits (was 2)") || rdb.HGet(t.Context(), key, "{size}").Val() != "3:"+strconv.Itoa(schema.SemLayout) { // size:layout
		t.Fatalf("resize 2 -> 3: exit %d, stdout %q, stderr %q, stored %q", code, p.stdout.String(), p.stderr.String(), rdb.HGet(t.Context(), key, "{size}").Val())
	}
	code, p = runCode(t, addr, "sem", "--limit", "2", "--resize", "4", name)
	if code != exitUsage || !strings.Contains(p.stderr.String(), "stored size 3") || !strings.Contains(p.stderr.String(), "--limit 3 --resize 4") ||
		rdb.HGet(t.Context(), key, "{size}").Val() != "3:"+strconv.Itoa(schema.SemLayout) { // size:layout
		t.Fatalf("resize from a size that is not stored: exit %d, stderr %q; want %d and nothing changed", code, p.stderr.String(), exitUsage)
	}
	if code, p := runCode(t, addr, "sem", "--limit", "2", name, "--", "true"); code != 0 {
		t.Errorf("sem with the old --limit: exit %d, stderr %q; want 0 (the stored size rules)", code, p.stderr.String())
	}
	if code, p := runCode(t, addr, "sem", "--limit", "3", "--permits", "3", name, "--", "true"); code != 0 {
		t.Errorf("sem with the new --limit: exit %d, stderr %q", code, p.stderr.String())
	}
}

// "sem --resize M takes a size M >= 1 and no command", but the
// check is *resize < 0 || (*resize > 0 && argv != nil): --resize 0 passes
// it and is then ignored (the resize branch runs only for *resize > 0),
// so "sem --limit 2 --resize 0 NAME -- CMD" takes a permit and runs CMD
// instead of failing with a usage error (a typo in a resize runs the
// job, or holds a permit until signalled when no CMD is given).
func TestSemResizeZeroIsNotAUsageError(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	if code, p := runCode(t, addr, "sem", "--limit", "2", "--resize", "0", name, "--", "true"); code != exitUsage {
		t.Fatalf("sem --resize 0 with a command: exit %d, want %d (usage); stdout %q, stderr %q",
			code, exitUsage, p.stdout.String(), p.stderr.String())
	}
}

// TestSemSizeMismatchNamesResize: another --limit than the stored size
// works with the stored size; asking for more permits than it is a usage
// error that gives the stored size and the flags that change it.
func TestSemSizeMismatchNamesResize(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	if code, p := runCode(t, addr, "sem", "--limit", "2", name, "--", "true"); code != 0 {
		t.Fatalf("sem --limit 2: exit %d, stderr %q", code, p.stderr.String())
	}
	if code, p := runCode(t, addr, "sem", "--limit", "3", name, "--", "true"); code != 0 {
		t.Fatalf("sem --limit 3 of a semaphore of 2: exit %d, stderr %q; want 0", code, p.stderr.String())
	}
	code, p := runCode(t, addr, "sem", "--limit", "3", "--permits", "3", name, "--", "true")
	if s := p.stderr.String(); code != exitUsage || !strings.Contains(s, "stored size 2, not --limit 3") || !strings.Contains(s, "--limit 2 --resize 3") {
		t.Errorf("sem --limit 3 --permits 3 of a semaphore of 2: exit %d, stderr %q; want %d, the stored size and --resize", code, s, exitUsage)
	}
}
