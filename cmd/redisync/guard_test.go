package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// alive reports whether the process pid runs (exists, not a zombie).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// TestWrapperKilledKillsCommand SIGKILLs redisync while its command runs:
// the command, its child and a child that left the session with setsid
// are all gone within a second.
func TestWrapperKilledKillsCommand(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the guard is Linux only")
	}
	addr := redistest.Addr(t)
	pids := filepath.Join(t.TempDir(), "pids")
	// No descendant holds redisync's stdout or stderr, which the test waits for.
	script := `exec >/dev/null 2>&1; sleep 300 & a=$!; setsid sleep 301 & b=$!; echo "$$ $a $b" > "$0.tmp"; mv "$0.tmp" "$0"; wait`
	p := start(t, addr, "lock", uniqueName(t), "--", "sh", "-c", script, pids)
	waitFor(t, "the command to start its children", func() bool { return fileHas(pids, " ") || p.exited() })
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	var procs []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, pid)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	deadline := time.Now().Add(time.Second)
	for _, pid := range procs {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d of %v still runs 1 s after redisync was killed", pid, procs)
			}
			time.Sleep(5 * time.Millisecond) // polls a condition, with the deadline above
		}
	}
}

// TestStdinReachesCommand checks that the command reads redisync's stdin
// through the guard.
func TestStdinReachesCommand(t *testing.T) {
	addr := redistest.Addr(t)
	cmd := exec.Command(binary, "lock", uniqueName(t), "--", "sh", "-c", "read line; echo got $line")
	cmd.Env = append(os.Environ(), "REDIS_URL=", "REDIS_ADDR="+addr)
	cmd.Stdin = strings.NewReader("hello\n")
	out, err := cmd.Output()
	if err != nil || string(out) != "got hello\n" {
		t.Errorf("stdout %q, %v; want %q", out, err, "got hello\n")
	}
}
