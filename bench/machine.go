package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/redisync/redisync/internal/redisinfo"
)

// machine describes where a run took place, for the report's first line.
type machine struct {
	server     string // "redis 7.0.15", "valkey 8.1.1"
	loadBefore string // /proc/loadavg's 1-minute figure; "?" elsewhere
	loadAfter  string
}

// String is one line: platform, CPUs, Go and server versions, load.
func (m machine) String() string {
	return fmt.Sprintf("%s/%s, %d CPUs (GOMAXPROCS %d), %s, %s; 1-minute load average %s at the start, %s at the end",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(),
		m.server, m.loadBefore, m.loadAfter)
}

// loadAverage returns the 1-minute load average, "?" when unknown. On a
// shared machine it says how much else was running.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// version names the server and its version ("valkey 8.1.1"; Valkey's
// redis_version is 7.2.4), "?" when unknown.
func (s *server) version(ctx context.Context) string {
	info, err := s.admin.Info(ctx, "server").Result()
	if err != nil {
		return "?"
	}
	i := redisinfo.Parse(info)
	return i.Name + " " + i.Version
}
