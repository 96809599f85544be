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
// Spawn, which needs redis-server on PATH. The servers are started by
// internal/redisserver, the launcher the benchmark uses too.
package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redisinfo"
	"github.com/redisync/redisync/internal/redisserver"
)

// RequireEnv is the variable that turns a missing Redis from a skip into a
// failure.
const RequireEnv = "REDISYNC_REQUIRE_REDIS"

var shared struct {
	once      sync.Once
	fallbacks []Starter
	addr      string
	why       string // why there is no Redis, when addr is ""
	server    *redisserver.Server
	cleanup   func()

	mu     sync.Mutex
	served []string // the servers the tests used, described (see note)
}

// ReportEnv names a file to which Main appends the line that says which
// servers the package's tests ran against, so that a run of many packages
// (CI) shows one line per package; Main prints it to its output too,
// which go test shows when the package fails.
const ReportEnv = "REDISYNC_SERVER_REPORT"

// note records a server the package's tests use, named by what its INFO
// says (server_name and valkey_version for Valkey, whose redis_version is
// 7.2.4), and where it came from: each kind once.
func note(addr, from string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer func() { _ = rdb.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	served := fmt.Sprintf("a server whose INFO failed, %s", from)
	if server, err := rdb.Info(ctx, "server").Result(); err == nil {
		i := redisinfo.Parse(server)
		served = fmt.Sprintf("%s %s, %s", i.Name, i.Version, from)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !slices.Contains(shared.served, served) {
		shared.served = append(shared.served, served)
	}
}

// report prints, and appends to the file ReportEnv names, which servers
// the package's tests ran against.
func report() {
	shared.mu.Lock()
	served := strings.Join(shared.served, "; ")
	shared.mu.Unlock()
	if served == "" {
		return
	}
	pkg := "tests"
	if bi, ok := debug.ReadBuildInfo(); ok {
		pkg = strings.TrimSuffix(bi.Path, ".test")
	}
	line := fmt.Sprintf("%s ran against %s\n", pkg, served)
	fmt.Print(line)
	if path := os.Getenv(ReportEnv); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			_, _ = f.WriteString(line)
			_ = f.Close()
		}
	}
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
	report()
	if shared.server != nil {
		if left := persistent(shared.addr); code == 0 && len(left) > 0 {
			fmt.Fprintf(os.Stderr, "redistest: keys left without a TTL after the tests: %s\n", strings.Join(left, ", "))
			code = 1
		}
		_ = shared.server.Stop()
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
		note(a, "REDIS_ADDR "+a)
		return a, ""
	}
	if path, err := exec.LookPath("redis-server"); err == nil {
		s, err := redisserver.Start("redis-server", "")
		if err != nil {
			return "", err.Error()
		}
		shared.server = s
		note(s.Addr, path)
		return s.Addr, ""
	}
	why = "REDIS_ADDR unset, no redis-server on PATH"
	for _, f := range shared.fallbacks {
		a, stop, err := f()
		if err == nil {
			shared.cleanup = stop
			note(a, "a fallback's server at "+a)
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
	s    *redisserver.Server
}

// wrap makes a test's Server of s.
func wrap(s *redisserver.Server) *Server { return &Server{Addr: s.Addr, s: s} }

// Spawn starts a redis-server of the test's own with the extra
// configuration args (such as "--appendonly", "yes"), stopped when the test
// ends. It skips (or fails, under REDISYNC_REQUIRE_REDIS=1) without
// redis-server on PATH.
func Spawn(tb testing.TB, args ...string) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(tb, "no redis-server on PATH for a test that starts its own")
	}
	s, err := redisserver.Start("redis-server", "", args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Stop() })
	path, _ := exec.LookPath("redis-server")
	note(s.Addr, path)
	return wrap(s)
}

// Kill ends the server with SIGKILL and waits until it has exited.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	s.s.Kill()
}

// Restart starts the server again on the same port after Kill.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if err := s.s.Restart(); err != nil {
		tb.Fatal(err)
	}
}

// Signal sends sig (such as SIGSTOP or SIGCONT) to the server process.
func (s *Server) Signal(tb testing.TB, sig os.Signal) {
	tb.Helper()
	if err := s.s.Signal(sig); err != nil {
		tb.Fatal(err)
	}
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
