package redisserver

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// needRedis skips without redis-server on PATH, or fails when
// REDISYNC_REQUIRE_REDIS=1 (as in CI).
func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("REDISYNC_REQUIRE_REDIS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

func TestKillRestartStop(t *testing.T) {
	needRedis(t)
	s, err := Start("redis-server", "")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Running() || !ping(s.Addr) {
		t.Fatal("a started server does not answer")
	}
	if err := s.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	s.Kill() // a paused server too
	if s.Running() || ping(s.Addr) {
		t.Fatal("a killed server still answers")
	}
	if err := s.Signal(syscall.SIGCONT); err == nil {
		t.Error("a signal to a killed server did not fail")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if !ping(s.Addr) {
		t.Fatal("a restarted server does not answer")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Errorf("the server's directory is still there after Stop: %v", err)
	}
}

func TestStartFailsWithTheLog(t *testing.T) {
	needRedis(t)
	_, err := Start("redis-server", "", "--no-such-option", "x")
	if err == nil {
		t.Fatal("a server with a bad option started")
	}
	if !strings.Contains(err.Error(), "no-such-option") {
		t.Errorf("the error does not quote the server's log: %v", err)
	}
	if _, err := Start("/nonexistent/redis-server", ""); err == nil {
		t.Fatal("a missing binary started")
	}
}
