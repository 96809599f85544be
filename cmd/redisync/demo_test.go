package main

import (
	"strings"
	"testing"

	"github.com/redisync/redisync/internal/redistest"
)

func TestDemoEmbedded(t *testing.T) {
	code, p := runCode(t, "", "demo", "--duration", "1s")
	out := p.stdout.String()
	if code != 0 || !strings.Contains(out, "on embedded Redis") || !strings.Contains(out, "all checks passed") ||
		!strings.Contains(out, "0 times two workers held it at once") || strings.Contains(out, "\x1b[") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, p.stderr.String())
	}
}

func TestDemoRealRedis(t *testing.T) {
	addr := redistest.Addr(t)
	code, p := runCode(t, "", "demo", "--redis", "redis://"+addr, "--name", uniqueName(t), "--duration", "500ms", "--clients", "2")
	if out := p.stdout.String(); code != 0 || !strings.Contains(out, "Redis at redis://"+addr) || !strings.Contains(out, "all checks passed") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, p.stderr.String())
	}
}

func TestDemoUsage(t *testing.T) {
	if code, _ := runCode(t, "", "demo", "--duration", "0s"); code != exitUsage {
		t.Errorf("exit %d, want %d", code, exitUsage)
	}
}
