package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
	"go.uber.org/goleak"
)

// binary is the redisync command built for the tests by TestMain.
var binary string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(buildFirst{redistest.Main(m)})
}

// buildFirst builds the command into a temporary directory, then runs
// the tests.
type buildFirst struct{ tests interface{ Run() int } }

func (b buildFirst) Run() int {
	dir, err := os.MkdirTemp("", "redisync-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binary = filepath.Join(dir, "redisync")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 2
	}
	return b.tests.Run()
}

// syncBuffer is a bytes.Buffer safe for the writes of exec's copying
// goroutines and the reads of a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a running redisync.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{} // closed when it exited
	code           int
}

// start runs redisync with args against the Redis at addr ("" for none:
// neither $REDIS_URL nor $REDIS_ADDR is set). It is killed when the test
// ends, if it still runs.
func start(t *testing.T, addr string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "REDIS_URL=", "REDIS_ADDR="+addr)
	return startCmd(t, cmd, func() { _ = cmd.Process.Kill() })
}

// startCmd starts cmd, its output kept in the proc's buffers. kill ends
// it when the test ends, if it still runs.
func startCmd(t *testing.T, cmd *exec.Cmd, kill func()) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee) && ee.ExitCode() >= 0:
			p.code = ee.ExitCode()
		default:
			p.code = -1 // killed by a signal
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			kill()
			<-p.done
		}
	})
	return p
}

// wait waits for p to exit, at most 20 s, and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(20 * time.Second):
		t.Fatalf("redisync %q still running after 20s\nstdout: %s\nstderr: %s", p.cmd.Args[1:], p.stdout.String(), p.stderr.String())
		return 0
	}
}

// exited reports whether p has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// runCode runs redisync to the end and returns its exit code.
func runCode(t *testing.T, addr string, args ...string) (int, *proc) {
	t.Helper()
	p := start(t, addr, args...)
	return p.wait(t), p
}

// waitFor waits until cond holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	redistest.Eventually(t, 10*time.Second, what, cond)
}

var nameSeq atomic.Int64

// uniqueName returns a lock name of the test's own.
func uniqueName(t *testing.T) string {
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid(), nameSeq.Add(1))
}

// holdLock takes the lock name from the test through the library; it is
// released when the test ends.
func holdLock(t *testing.T, name string, opts ...redisync.Option) *redisync.Mutex {
	t.Helper()
	c, err := redisync.New(redistest.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	m := must(c.NewMutex(name, opts...))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Unlock(context.Background()) })
	return m
}

// queueLen returns the number of fair waiters of the lock name.
func queueLen(t *testing.T, name string) int64 {
	t.Helper()
	n, err := redistest.Client(t).LLen(context.Background(), schema.LockKeys("redisync", name).Queue).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fileHas reports whether the file at path exists and contains s.
func fileHas(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}

func TestUsage(t *testing.T) {
	if code, p := runCode(t, ""); code != exitUsage || !strings.Contains(p.stderr.String(), "redisync lock") {
		t.Errorf("no arguments: exit %d, stderr %q; want %d and the usage", code, p.stderr.String(), exitUsage)
	}
	for _, cmd := range []string{"lock", "status", "demo"} {
		code, p := runCode(t, "", cmd, "--help")
		if code != exitOK || !strings.Contains(p.stdout.String(), "Examples:") || !strings.Contains(p.stdout.String(), "-redis") {
			t.Errorf("%s --help: exit %d, stdout %q; want 0, examples and flags", cmd, code, p.stdout.String())
		}
	}
	if code, _ := runCode(t, "", "frobnicate"); code != exitUsage {
		t.Errorf("unknown command: exit %d, want %d", code, exitUsage)
	}
}

func TestLockExcludes(t *testing.T) {
	addr := redistest.Addr(t)
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			name, log := uniqueName(t), filepath.Join(t.TempDir(), "log")
			// Each command appends "start ID", works a little, and appends
			// "end ID": with the lock held, the lines alternate.
			script := `echo "start $1" >> "$0"; sleep 0.05; echo "end $1" >> "$0"`
			const n = 4
			var procs []*proc
			for i := range n {
				args := []string{"lock", name, "--", "sh", "-c", script, log, fmt.Sprint(i)}
				if !fair {
					args = append([]string{"lock", "--barging"}, args[1:]...)
				} else if i%2 == 1 {
					// --fair, the default, still runs (scripts of earlier versions).
					args = append([]string{"lock", "--fair"}, args[1:]...)
				}
				procs = append(procs, start(t, addr, args...))
			}
			for _, p := range procs {
				if code := p.wait(t); code != 0 {
					t.Fatalf("exit %d, stderr: %s", code, p.stderr.String())
				}
			}
			b, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) != 2*n {
				t.Fatalf("log has %d lines, want %d:\n%s", len(lines), 2*n, b)
			}
			seen := map[string]bool{}
			for i := 0; i < len(lines); i += 2 {
				id := strings.TrimPrefix(lines[i], "start ")
				if !strings.HasPrefix(lines[i], "start ") || lines[i+1] != "end "+id || seen[id] {
					t.Fatalf("holds overlap or repeat at line %d:\n%s", i+1, b)
				}
				seen[id] = true
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	cases := []struct {
		what   string
		args   []string
		code   int
		stderr string
	}{
		{"exit 3", []string{"lock", name, "--", "sh", "-c", "exit 3"}, 3, ""},
		{"killed by SIGTERM", []string{"lock", name, "--", "sh", "-c", "kill -TERM $$"}, 128 + 15, ""},
		{"not found", []string{"lock", name, "--", "/nonexistent/redisync-test-cmd"}, exitNotFound, "cannot run"},
		{"no -- before CMD", []string{"lock", name, "true"}, exitUsage, "missing -- before the command"},
		{"nothing after --", []string{"lock", name, "--"}, exitUsage, "missing command"},
		{"no name", []string{"lock", "--", "true"}, exitUsage, "missing NAME"},
		{"bad flag", []string{"lock", "--wiat", "1s", name, "--", "true"}, exitUsage, "wiat"},
		{"bad URL", []string{"lock", "--redis", "redis://:s3cret@127.0.0.1:notaport", name, "--", "true"}, exitUsage, "bad Redis URL"},
		{"bad scheme", []string{"lock", "--redis", "http://127.0.0.1:1", name, "--", "true"}, exitUsage, "bad Redis URL"},
	}
	for _, c := range cases {
		code, p := runCode(t, addr, c.args...)
		if code != c.code || !strings.Contains(p.stderr.String(), c.stderr) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", c.what, code, p.stderr.String(), c.code, c.stderr)
		}
		if strings.Contains(p.stderr.String(), "s3cret") {
			t.Errorf("%s: the password is in the message: %q", c.what, p.stderr.String())
		}
	}
}

func TestUnreachable(t *testing.T) {
	srv := redistest.Spawn(t)
	srv.Kill(t) // a port where nothing listens
	code, p := runCode(t, srv.Addr, "lock", uniqueName(t), "--", "true")
	if code != exitUnavailable || !strings.HasPrefix(p.stderr.String(), "redisync: cannot reach Redis at "+srv.Addr) ||
		strings.Count(p.stderr.String(), "\n") != 1 {
		t.Errorf("exit %d, stderr %q; want %d and redisync's message alone", code, p.stderr.String(), exitUnavailable)
	}
	code, p = runCode(t, "", "status", "--redis", "redis://"+srv.Addr, uniqueName(t))
	if code != exitUnavailable {
		t.Errorf("status: exit %d, stderr %q; want %d", code, p.stderr.String(), exitUnavailable)
	}
}

func TestWaitExpires(t *testing.T) {
	addr := redistest.Addr(t)
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			name, ran := uniqueName(t), filepath.Join(t.TempDir(), "ran")
			var opts []redisync.Option
			args := []string{"lock", "--wait", "300ms"}
			if !fair {
				opts = append(opts, redisync.Barging())
				args = append(args, "--barging")
			}
			holdLock(t, name, opts...)
			code, p := runCode(t, addr, append(args, name, "--", "touch", ran)...)
			if code != exitTimeout || !strings.Contains(p.stderr.String(), "timed out after 300ms (--wait)") {
				t.Errorf("exit %d, stderr %q; want %d", code, p.stderr.String(), exitTimeout)
			}
			if _, err := os.Stat(ran); err == nil {
				t.Error("the command ran without the lock")
			}
			if n := queueLen(t, name); n != 0 {
				t.Errorf("%d waiters left queued", n)
			}
		})
	}
}

func TestInterruptWhileWaiting(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	holdLock(t, name)
	p := start(t, addr, "lock", name, "--", "true")
	waitFor(t, "the waiter to queue", func() bool { return queueLen(t, name) == 1 })
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != exitSignal+int(syscall.SIGINT) || !strings.Contains(p.stderr.String(), "left nothing queued") {
		t.Errorf("exit %d, stderr %q; want %d", code, p.stderr.String(), exitSignal+int(syscall.SIGINT))
	}
	if n := queueLen(t, name); n != 0 {
		t.Errorf("%d waiters left queued", n)
	}
	h, err := redistest.Client(t).HGetAll(context.Background(), schema.LockKeys("redisync", name).Hash).Result()
	if st, ok := schema.ParseLockState(h); err != nil || !ok || st.Queue != 0 || len(st.Clients) != 0 {
		t.Errorf("waiter records left: %+v, %v", st, err)
	}
}

// loopScript writes "ready" to $0, then loops until a signal ends it.
// $1 is its trap for SIGTERM.
const loopScript = `trap "$1" TERM; echo ready > "$0"; while :; do sleep 0.02; done`

func TestSignalForwarded(t *testing.T) {
	addr := redistest.Addr(t)
	ready := filepath.Join(t.TempDir(), "ready")
	p := start(t, addr, "lock", uniqueName(t), "--", "sh", "-c", loopScript, ready, "exit 42")
	waitFor(t, "the command to start", func() bool { return fileHas(ready, "ready") || p.exited() })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 42 {
		t.Errorf("exit %d, stderr %q; want the command's 42", code, p.stderr.String())
	}
}

func TestLostLockKillsCommand(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t)
	cases := []struct {
		what, trap, stderr string
	}{
		{"the command exits on SIGTERM", `echo TERM >> "$0"; exit 0`, "sending SIGTERM"},
		{"the command ignores SIGTERM", `echo TERM >> "$0"`, "sending SIGKILL"},
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			name, file := uniqueName(t), filepath.Join(t.TempDir(), "log")
			p := start(t, addr, "lock", "--watchdog-lease", "300ms", "--grace", "300ms", name, "--",
				"sh", "-c", loopScript, file, c.trap)
			waitFor(t, "the command to start", func() bool { return fileHas(file, "ready") || p.exited() })
			if err := rdb.Del(context.Background(), schema.LockKeys("redisync", name).Hash).Err(); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != exitLost {
				t.Errorf("exit %d, want %d; stderr %q", code, exitLost, p.stderr.String())
			}
			if !fileHas(file, "TERM") {
				t.Error("the command got no SIGTERM")
			}
			if s := p.stderr.String(); !strings.Contains(s, "was LOST while the command ran") || !strings.Contains(s, c.stderr) {
				t.Errorf("stderr %q, want the loss explained and %q", s, c.stderr)
			}
		})
	}
}

func TestTokenInEnvironment(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	code, p := runCode(t, addr, "lock", name, "--", "sh", "-c", `echo "$REDISYNC_NAME $REDISYNC_TOKEN"`)
	token := redistest.NewClient(t, addr).HGet(context.Background(), schema.LockKeys("redisync", name).Hash, schema.TokenField).Val()
	if want := name + " " + token; code != 0 || token == "" || strings.TrimSpace(p.stdout.String()) != want {
		t.Errorf("exit %d, stdout %q; want %q", code, p.stdout.String(), want)
	}
}

// holdIDs returns the holder of the lock whose hash is key, while its
// lease lasts: none, or one.
func holdIDs(t *testing.T, rdb redis.Cmdable, key string) []string {
	t.Helper()
	if st, now := lockState(t, rdb, key); st.Held(now) {
		return []string{st.Owner}
	}
	return nil
}

// lockState returns what the hash of a lock says, and the server's time
// in ms.
func lockState(t *testing.T, rdb redis.Cmdable, key string) (schema.LockState, int64) {
	t.Helper()
	h, err := rdb.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	st, ok := schema.ParseLockState(h)
	if !ok {
		t.Fatalf("%s is not a lock of layout %d: %q", key, schema.Layout, h)
	}
	return st, now.UnixMilli()
}

// must returns v, a value that a constructor made, and panics with err,
// the constructor's error: a test whose arguments are valid by design
// fails at once (and loudly) if they are not.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
