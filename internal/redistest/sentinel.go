package redistest

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/redisync/redisync/internal/redisserver"
)

// SpawnSentinel starts a Redis Sentinel of the test's own that monitors
// the primary at primaryAddr under the name master, with a quorum of 1 and
// a primary counted down after 1 s. It is stopped when the test ends.
func SpawnSentinel(tb testing.TB, master, primaryAddr string) *Server {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(tb, "no redis-server on PATH for a sentinel test")
	}
	host, port, ok := strings.Cut(primaryAddr, ":")
	if !ok {
		tb.Fatalf("redistest: bad primary address %q", primaryAddr)
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 1\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n", master, host, port)
	s, err := redisserver.Start("redis-server", conf, "--sentinel")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Stop() })
	return wrap(s)
}
