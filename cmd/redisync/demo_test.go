package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// The demo shows the observed figures while it runs, and writes them to
// --metrics-out: one line per primitive at every refresh.
func TestDemoLiveFigures(t *testing.T) {
	file := filepath.Join(t.TempDir(), "demo.csv")
	code, p := runCode(t, "", "demo", "--duration", "1200ms", "--metrics-out", file)
	out := p.stdout.String()
	if code != 0 || !strings.Contains(out, "waiting ") || !strings.Contains(out, "wait p50 ") || !strings.Contains(out, "lost 0") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, p.stderr.String())
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if lines[0]+"\n" != metricsHeader || len(lines) < 5 {
		t.Fatalf("metrics file:\n%s", data)
	}
	for _, l := range lines[1:] {
		f := strings.Split(l, ",")
		if len(f) != 7 || !slices.Contains([]string{"mutex", "semaphore", "rwmutex", "multimutex", "election"}, f[1]) {
			t.Errorf("bad line %q", l)
		}
	}
	// By the last refresh, the lock has been taken: a wait was seen.
	lastMutex := ""
	for _, l := range lines {
		if strings.Contains(l, ",mutex,") {
			lastMutex = l
		}
	}
	last := strings.Split(lastMutex, ",")
	if p99, err := strconv.ParseFloat(last[4], 64); err != nil || p99 <= 0 {
		t.Errorf("no wait p99 in %q", lastMutex)
	}
}

func TestQuantile(t *testing.T) {
	ds := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5}, {0.99, 10}, {0.1, 1}, {1, 10}} {
		if got := quantile(ds, tc.q); got != tc.want {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing is not 0")
	}
}

// demo --plain prints its progress in lines of at most plainWidth
// columns, however many clients and workers queue.
func TestDemoPlainWidth(t *testing.T) {
	code, p := runCode(t, "", "demo", "--plain", "--duration", "1200ms", "--clients", "8", "--workers", "4")
	out := p.stdout.String()
	// 32 workers queue for the lock, in a line of their own before. So
	// short a run may leave a worker without its turn: a failed check
	// (70) is not what this test is about.
	if code != 0 && code != exitSoftware {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, p.stderr.String())
	}
	progress := 0
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > plainWidth {
			t.Errorf("a line of %d columns, more than %d:\n%s", n, plainWidth, l)
		}
		if strings.Contains(l, "waiting ") && strings.Contains(l, "lost ") {
			progress++
		}
	}
	if progress < 5 {
		t.Errorf("%d lines of progress figures, want one per primitive at least:\n%s", progress, out)
	}
}

func TestWrap(t *testing.T) {
	cases := []struct {
		text  string
		width int
		want  []string
	}{
		{"a b c", 10, []string{"> a b c"}},
		{"aaa bbb ccc", 9, []string{"> aaa bbb", "  ccc"}},
		{"aaaaaaaaaaaa b", 6, []string{"> aaaa", "  aaaa", "  aaaa", "  b"}},
		{"", 10, []string{"> "}},
	}
	for _, c := range cases {
		got := wrap(c.text, c.width, "> ", "  ")
		if !slices.Equal(got, c.want) {
			t.Errorf("wrap(%q, %d) = %q, want %q", c.text, c.width, got, c.want)
		}
	}
}
