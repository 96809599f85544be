// Package redistest gives tests a real Redis, found the way a developer's
// machine has one:
//
//  1. REDIS_ADDR, when it is set;
//  2. otherwise a redis-server binary on PATH, spawned on a free loopback
//     port once per test package (and stopped by Main);
//  3. otherwise a Redis started by a fallback given to Main: the
//     integration module's tests pass a redis:7 container through
//     testcontainers-go, used when a Docker engine answers (it is there,
//     not here, so that Docker's client stays out of the root module);
//  4. otherwise the test is skipped with a message saying so, or fails when
//     REDISYNC_REQUIRE_REDIS=1 (as in CI).
//
// Tests that kill, pause or restart Redis spawn servers of their own with
// Spawn, which needs redis-server on PATH.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// RequireEnv is the variable that turns a missing Redis from a skip into a
// failure.
const RequireEnv = "REDISYNC_REQUIRE_REDIS"

var shared struct {
	once      sync.Once
	fallbacks []Starter
	addr      string
	why       string // why there is no Redis, when addr is ""
	server    *Server
	cleanup   func()
}

// Starter starts a Redis of its own and returns its address and a function
// that stops it.
type Starter func() (addr string, stop func(), err error)

// Main runs the package's tests, then stops the Redis it started. Use it
// as goleak.VerifyTestMain(redistest.Main(m)). The fallbacks are tried in
// order when there is neither REDIS_ADDR nor redis-server on PATH.
func Main(m *testing.M, fallbacks ...Starter) interface{ Run() int } {
	shared.fallbacks = fallbacks
	return mainRunner{m}
}

type mainRunner struct{ m *testing.M }

func (r mainRunner) Run() int {
	code := r.m.Run()
	if shared.server != nil {
		if left := persistent(shared.addr); code == 0 && len(left) > 0 {
			fmt.Fprintf(os.Stderr, "redistest: keys left without a TTL after the tests: %s\n", strings.Join(left, ", "))
			code = 1
		}
		shared.server.stop()
	}
	if shared.cleanup != nil {
		shared.cleanup()
	}
	return code
}

// persistent lists the keys of the Redis at addr that have no TTL: after a
// package's tests, on the Redis it spawned for them, there must be none
// (redisync leaves nothing for good; a test that writes keys of its own
// removes them).
func persistent(addr string) []string {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer func() { _ = rdb.Close() }()
	ctx := context.Background()
	var left []string
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		if rdb.PTTL(ctx, iter.Val()).Val() == -1 {
			left = append(left, iter.Val())
		}
	}
	if err := iter.Err(); err != nil {
		left = append(left, "(scan: "+err.Error()+")")
	}
	return left
}

// Addr returns the address of the package's Redis, or skips (fails under
// REDISYNC_REQUIRE_REDIS=1) when there is none.
func Addr(tb testing.TB) string {
	tb.Helper()
	shared.once.Do(func() { shared.addr, shared.why = find() })
	if shared.addr == "" {
		missing(tb, shared.why)
	}
	return shared.addr
}

// Client returns a go-redis client to the package's Redis, closed when the
// test ends.
func Client(tb testing.TB) *redis.Client {
	tb.Helper()
	return NewClient(tb, Addr(tb))
}

// NewClient returns a go-redis client to addr, closed when the test ends.
func NewClient(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// missing skips or fails a test that has no Redis.
func missing(tb testing.TB, why string) {
	tb.Helper()
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("no Redis and %s=1: %s", RequireEnv, why)
	}
	tb.Skipf("no Redis (%s); set REDIS_ADDR or install redis-server", why)
}

// find locates or starts the package's Redis.
func find() (addr, why string) {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a, ""
	}
	if _, err := exec.LookPath("redis-server"); err == nil {
		s, err := start(freePort, "")
		if err != nil {
			return "", err.Error()
		}
		shared.server = s
		return s.Addr, ""
	}
	why = "REDIS_ADDR unset, no redis-server on PATH"
	for _, f := range shared.fallbacks {
		a, stop, err := f()
		if err == nil {
			shared.cleanup = stop
			return a, ""
		}
		why += ", " + err.Error()
	}
	return "", why
}

// Server is a redis-server process of a test's own, on a loopback port.
type Server struct {
	// Addr is host:port.
	Addr string
	port int
	args []string
	dir  string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Spawn starts a redis-server of the test's own with the extra
// configuration args (such as "--appendonly", "yes"), stopped when the test
// ends. It skips (or fails, under REDISYNC_REQUIRE_REDIS=1) without
// redis-server on PATH.
func Spawn(tb testing.TB, args ...string) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(tb, "no redis-server on PATH for a test that starts its own")
	}
	s, err := start(freePort, "", args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.stop)
	return s
}

// start runs redis-server on a port from pick, with no persistence unless
// args ask for it, and waits until it answers. A non-empty conf is written
// to a configuration file that the server is started with.
func start(pick func() (int, error), conf string, args ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	if conf != "" {
		path := filepath.Join(dir, "redis.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		args = append([]string{path}, args...)
	}
	for try := 0; try < 5; try++ {
		port, err := pick()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), port: port, args: args, dir: dir}
		if err = s.launch(); err == nil {
			return s, nil
		}
		// Another process may have taken the port meanwhile: try another.
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: redis-server did not start")
}

// launch starts the process on s's port and waits until it answers PING.
func (s *Server) launch() error {
	argv := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--protected-mode", "no",
	}
	if len(s.args) > 0 && !strings.HasPrefix(s.args[0], "--") {
		// A configuration file goes first.
		argv = append([]string{s.args[0]}, append(argv, s.args[1:]...)...)
	} else {
		argv = append(argv, s.args...)
	}
	cmd := exec.Command("redis-server", argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("redistest: redis-server on %s exited", s.Addr)
		default:
		}
		if ping(s.Addr) {
			s.mu.Lock()
			s.cmd = cmd
			s.mu.Unlock()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("redistest: redis-server on %s did not answer", s.Addr)
}

// Kill ends the server with SIGKILL and waits until the port is closed.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for ping(s.Addr) {
		if time.Now().After(deadline) {
			tb.Fatalf("redis-server on %s still answers after SIGKILL", s.Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Restart starts the server again on the same port after Kill.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if err := s.launch(); err != nil {
		tb.Fatal(err)
	}
}

// Signal sends sig (such as SIGSTOP or SIGCONT) to the server process.
func (s *Server) Signal(tb testing.TB, sig os.Signal) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		tb.Fatal("redistest: server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		tb.Fatal(err)
	}
}

// running reports whether the server process runs (not killed).
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// stop kills the server and removes its directory.
func (s *Server) stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGCONT) // in case a test paused it
		_ = cmd.Process.Kill()
	}
	_ = os.RemoveAll(s.dir)
}

// ping reports whether a Redis answers PING on addr.
func ping(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 7)
	n, _ := conn.Read(buf)
	return string(buf[:n]) == "+PONG\r\n"
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Name returns a name for a lock or semaphore that no other test uses:
// the test's name and a random suffix.
func Name(tb testing.TB) string {
	return strings.ReplaceAll(tb.Name(), "/", "-") + "-" + uuid.NewString()[:8]
}

// Eventually fails the test unless cond becomes true within d, looking
// every millisecond; what names the condition in the failure.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}
