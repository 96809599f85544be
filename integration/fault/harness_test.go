package fault

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

var ctx = context.Background()

// lockKey and channel are a lock's hash key and channel under the default
// prefix.
func lockKey(name string) string { return "redisync:lock:{" + name + "}" }
func channel(name string) string { return lockKey(name) + ":ch" }

// newClient returns a redisync Client on a go-redis client of its own to
// addr, closed (before the go-redis client) when the test ends.
func newClient(t *testing.T, addr string, opts ...redisync.Option) *redisync.Client {
	t.Helper()
	c, err := redisync.New(redistest.NewClient(t, addr), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// eventually fails the test unless cond becomes true within d.
var eventually = redistest.Eventually

// subscribers returns how many connections are subscribed to a lock's
// channels: one per Client with a confirmed waiter, fair or barging, on
// its own grant channel (or on the lock's channel, for an older version's
// barging waiters).
func subscribers(t *testing.T, rdb *redis.Client, name string) int64 {
	t.Helper()
	n, err := rdb.PubSubNumSub(ctx, channel(name)).Result()
	if err != nil {
		t.Fatal(err)
	}
	grants, err := rdb.PubSubChannels(ctx, channel(name)+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n[channel(name)] + int64(len(grants))
}

// result is what a goroutine blocked in Lock ends with.
type result struct {
	err error
	at  time.Time
}

// lockAsync calls m.Lock(lctx) in a goroutine and returns its result.
func lockAsync(m *redisync.Mutex, lctx context.Context) <-chan result {
	done := make(chan result, 1)
	go func() {
		err := m.Lock(lctx)
		done <- result{err, time.Now()}
	}()
	return done
}

// await waits for a Lock result, failing the test after d.
func await(t *testing.T, done <-chan result, d time.Duration, what string) result {
	t.Helper()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r
	case <-time.After(d):
		t.Fatalf("%s: not done after %v", what, d)
	}
	panic("unreachable")
}

// proc is a holder helper process (see internal/holder).
type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin *os.File
	lines chan line
	eof   chan struct{}

	mu   sync.Mutex
	seen []line // read by expect while waiting for another prefix
	done bool
}

type line struct {
	text string
	at   time.Time
}

// startHolder starts the holder helper with args and waits for "ready". It
// is killed, if still running, when the test ends.
func startHolder(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(holderBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdinR
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = stdinR.Close()
	p := &proc{t: t, cmd: cmd, stdin: stdinW, lines: make(chan line, 1024), eof: make(chan struct{})}
	go func() {
		defer close(p.eof)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- line{sc.Text(), time.Now()}
		}
	}()
	t.Cleanup(p.stop)
	p.expect("ready", 10*time.Second)
	return p
}

// send writes one command line to the helper.
func (p *proc) send(cmd string) {
	p.t.Helper()
	if _, err := p.stdin.WriteString(cmd + "\n"); err != nil {
		p.t.Fatalf("holder: send %q: %v", cmd, err)
	}
}

// expect waits up to d for a line starting with prefix and returns it with
// the time it was read. Lines skipped meanwhile are kept for later calls;
// an "error" line fails the test unless prefix asks for one.
func (p *proc) expect(prefix string, d time.Duration) (string, time.Time) {
	p.t.Helper()
	p.mu.Lock()
	for i, l := range p.seen {
		if strings.HasPrefix(l.text, prefix) {
			p.seen = append(p.seen[:i], p.seen[i+1:]...)
			p.mu.Unlock()
			return l.text, l.at
		}
	}
	p.mu.Unlock()
	timeout := time.After(d)
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l.text, "error") && !strings.HasPrefix(prefix, "error") {
				p.t.Fatalf("holder: %s (waiting for %q)", l.text, prefix)
			}
			if strings.HasPrefix(l.text, prefix) {
				return l.text, l.at
			}
			p.mu.Lock()
			p.seen = append(p.seen, l)
			p.mu.Unlock()
		case <-timeout:
			p.t.Fatalf("holder: no %q line after %v (seen %q)", prefix, d, p.saw())
		}
	}
}

// saw returns the lines expect skipped.
func (p *proc) saw() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s []string
	for _, l := range p.seen {
		s = append(s, l.text)
	}
	return s
}

// lockToken sends "lock" and returns the token of the hold.
func (p *proc) lockToken(d time.Duration) int64 {
	p.t.Helper()
	p.send("lock")
	l, _ := p.expect("locked ", d)
	tok, err := strconv.ParseInt(strings.TrimPrefix(l, "locked "), 10, 64)
	if err != nil {
		p.t.Fatal(err)
	}
	return tok
}

// signal sends sig to the helper.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// pause stops the helper with SIGSTOP and waits until the kernel has
// stopped it (a signal is delivered asynchronously: the helper could
// otherwise still act on what comes next).
func (p *proc) pause() {
	p.t.Helper()
	p.signal(syscall.SIGSTOP)
	stat := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	eventually(p.t, 5*time.Second, "the helper to be stopped", func() bool {
		b, err := os.ReadFile(stat)
		if err != nil {
			return true // not Linux: nothing to read, as before
		}
		// "pid (comm) state ...": the state follows the last ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return len(f) > 0 && (f[0] == "T" || f[0] == "t")
	})
}

// kill ends the helper with SIGKILL and waits for it.
func (p *proc) kill() {
	p.t.Helper()
	p.signal(syscall.SIGKILL)
	p.stop()
}

// stop kills the helper if it is still running and reaps it.
func (p *proc) stop() {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return
	}
	p.done = true
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	_ = p.stdin.Close()
	for {
		select {
		case <-p.lines:
			continue
		case <-p.eof:
		}
		break
	}
	_ = p.cmd.Wait()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func atoi64(s string) (int64, error) { return strconv.ParseInt(strings.TrimSpace(s), 10, 64) }

// must returns v, a value that a constructor made, and panics with err,
// the constructor's error: a test whose arguments are valid by design
// fails at once (and loudly) if they are not.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
