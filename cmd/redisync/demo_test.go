package main

import (
	"io"
	"strings"
	"testing"
	"time"

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

// failingPart is a demo part whose one check fails.
type failingPart struct{ demoPart }

func (failingPart) summary(io.Writer, time.Duration, *Status) []check {
	return []check{{false, "a check that fails"}}
}

func TestDemoFailedCheckExits70(t *testing.T) {
	d := &demo{parts: []demoPart{failingPart{}}}
	if code := d.summary(time.Second, &Status{}, false); code != exitSoftware {
		t.Errorf("exit %d, want %d", code, exitSoftware)
	}
}

func TestDemoLockChecks(t *testing.T) {
	p := &lockPart{acq: [][]int64{{3, 0}}, maxWait: [][]time.Duration{{0, 0}}, tokenBad: 1}
	p.violations.Store(2)
	st := &Status{Name: "demo", Lock: LockStatus{Holder: &Holder{Owner: "x"}}}
	failed := 0
	for _, c := range p.summary(io.Discard, time.Second, st) {
		if !c.ok {
			failed++
		}
	}
	// mutual exclusion, tokens, a starved worker, something left behind
	if failed != 4 {
		t.Errorf("%d checks failed, want 4", failed)
	}
}
