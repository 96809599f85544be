package main

// The help's examples, run: every example that "redisync help" and
// "redisync COMMAND --help" show runs here, on the test's Redis, and does
// what its comment and the help say (exit code, effect).

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// helpExamples returns the examples of a help text: after its "Examples:"
// line, the blocks of indented lines between blank lines, each without
// its comment lines and its indent. A line continued with "\" stays so,
// for the shell.
func helpExamples(help string) []string {
	_, after, ok := strings.Cut(help, "\nExamples:\n")
	if !ok {
		return nil
	}
	var examples, block []string
	flush := func() {
		if len(block) > 0 {
			examples = append(examples, strings.Join(block, "\n"))
		}
		block = nil
	}
	for _, l := range strings.Split(after, "\n") {
		switch {
		case strings.TrimSpace(l) == "":
			flush()
		case !strings.HasPrefix(l, "  "):
			flush()
			return examples // the end of the examples
		case strings.HasPrefix(strings.TrimSpace(l), "#"):
		default:
			block = append(block, strings.TrimPrefix(l, "  "))
		}
	}
	flush()
	return examples
}

func TestHelpExamplesParsed(t *testing.T) {
	help := "Usage: x\n\nExamples:\n  # one\n  a 1\n\n  # two\n  b \\\n      2\n  c\n\nMore text.\n  d\n"
	want := []string{"a 1", "b \\\n    2\nc"}
	if got := helpExamples(help); !slices.Equal(got, want) {
		t.Fatalf("helpExamples = %q, want %q", got, want)
	}
}

// exampleEnv is where one run of an example takes place: a directory of
// its own, with stand-ins for the programs the examples run (./backup.sh,
// ffmpeg, curl, ...), and a key prefix of its own on the test's Redis.
type exampleEnv struct {
	t      *testing.T
	dir    string
	prefix string
	client *redisync.Client // on the test's Redis, with the prefix
	// rdb is the Redis that the example's commands use, for the checks:
	// the test's, unless the run's setup starts one of its own.
	rdb redis.Cmdable
	log string // the stand-ins append what they ran here
}

// standIns are the programs the examples run, each replaced by the script
// standIn. Those with a "/" run from the example's directory, the others
// from PATH.
var standIns = []string{"./backup.sh", "./job.sh", "./step1.sh", "./step2.sh", "./migrate.sh", "./report.sh",
	"./train.sh", "./scheduler", "ffmpeg", "curl", "make"}

// standIn appends its name, its arguments and redisync's variables to
// $EXAMPLE_LOG and, when $EXAMPLE_HOLD is set, waits until that file
// exists (20 s at most), as a program that works a while.
const standIn = `#!/bin/sh
echo "$(basename "$0") $* token=$REDISYNC_TOKEN name=$REDISYNC_NAME value=$REDISYNC_VALUE permits=$REDISYNC_PERMITS" >> "$EXAMPLE_LOG"
i=0
while [ -n "$EXAMPLE_HOLD" ] && [ ! -e "$EXAMPLE_HOLD" ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done
`

func newExampleEnv(t *testing.T) *exampleEnv {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binary, filepath.Join(bin, "redisync")); err != nil {
		t.Fatal(err)
	}
	for _, s := range standIns {
		path := filepath.Join(bin, s)
		if rel, ok := strings.CutPrefix(s, "./"); ok {
			path = filepath.Join(dir, rel)
		}
		if err := os.WriteFile(path, []byte(standIn), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rdb := redistest.Client(t)
	e := &exampleEnv{t: t, dir: dir, prefix: fmt.Sprintf("ex%d-%d", os.Getpid(), nameSeq.Add(1)), rdb: rdb,
		log: filepath.Join(dir, "ran.log")}
	c, err := redisync.New(rdb, redisync.WithKeyPrefix(e.prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	e.client = c
	return e
}

// ran returns the lines of the stand-in prog in the log, in order.
func (e *exampleEnv) ran(prog string) []string {
	b, _ := os.ReadFile(e.log)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prog+" ") {
			lines = append(lines, l)
		}
	}
	return lines
}

// lastToken returns the last fencing token of a lock or election.
func (e *exampleEnv) lastToken(keys schema.Lock) string {
	return e.rdb.HGet(context.Background(), keys.Hash, schema.TokenField).Val()
}

// holdLock holds the lock name until the test ends.
func (e *exampleEnv) holdLock(name string) {
	m := must(e.client.NewMutex(name))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Lock(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = m.Unlock(context.Background()) })
}

// holdPermits holds n of the size permits of the semaphore name until the
// test ends.
func (e *exampleEnv) holdPermits(name string, size, n int64) {
	s := must(e.client.NewSemaphore(name, size))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Acquire(ctx, n); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = s.Release(context.Background(), n) })
}

// lead makes a candidate lead the election name with value until the test
// ends.
func (e *exampleEnv) lead(name, value string) {
	el := must(e.client.NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := el.Campaign(ctx, value); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = el.Resign(context.Background()) })
}

// ranWithToken checks that prog (with its arguments) ran once, with the
// last token of keys in REDISYNC_TOKEN, and returns its line.
func (e *exampleEnv) ranWithToken(prog string, keys schema.Lock) string {
	e.t.Helper()
	token, lines := e.lastToken(keys), e.ran(prog)
	if len(lines) != 1 || token == "" || !strings.Contains(lines[0], " token="+token+" ") {
		e.t.Errorf("%s ran %q; want it once with the token %q", prog, lines, token)
		return ""
	}
	return lines[0]
}

// didNotRun checks that prog did not run.
func (e *exampleEnv) didNotRun(prog string) {
	e.t.Helper()
	if lines := e.ran(prog); len(lines) > 0 {
		e.t.Errorf("%s ran without what it waits for: %q", prog, lines)
	}
}

// exampleRun is one run of an example and what it must do.
type exampleRun struct {
	what string // the case, for messages
	// setup prepares the run (holds a lock, starts servers of the test's
	// own) and returns pairs of old and new text to replace in the
	// example: the addresses of those servers, waits and durations cut
	// short. Nothing else of the example changes, but that every
	// redisync command gets a --prefix of the run's own.
	setup func(e *exampleEnv) (replace []string)
	// embedded runs it without $REDIS_ADDR, as on a machine without a
	// Redis (the demo then embeds one).
	embedded bool
	// during, if set, runs while the example does; the stand-ins wait
	// until it returns.
	during func(e *exampleEnv, p *proc)
	code   int // the exit code of the example's last command
	check  func(e *exampleEnv, p *proc)
}

// stdoutIs checks the run's output.
func stdoutIs(want string) func(e *exampleEnv, p *proc) {
	return func(e *exampleEnv, p *proc) {
		if got := p.stdout.String(); got != want {
			e.t.Errorf("stdout %q, want %q", got, want)
		}
	}
}

// stdoutHas checks that the run's output has each of want.
func stdoutHas(want ...string) func(e *exampleEnv, p *proc) {
	return func(e *exampleEnv, p *proc) {
		for _, w := range want {
			if !strings.Contains(p.stdout.String(), w) {
				e.t.Errorf("stdout %q, want %q in it", p.stdout.String(), w)
			}
		}
	}
}

// demoPassed checks that a demo ran on where and passed every check.
func demoPassed(where string) func(e *exampleEnv, p *proc) {
	return func(e *exampleEnv, p *proc) {
		if out := p.stdout.String(); !strings.Contains(out, "\nall checks passed\n") || !strings.Contains(strings.Join(strings.Fields(out), " "), " on "+where+" ") {
			e.t.Errorf("demo output, want every check passed on %s:\n%s", where, out)
		}
	}
}

// withLockHeld returns a setup that holds the lock name, and replaces
// text as replacing does.
func withLockHeld(name string, replace ...string) func(e *exampleEnv) []string {
	return func(e *exampleEnv) []string { e.holdLock(name); return replace }
}

// replacing returns a setup that replaces text only.
func replacing(replace ...string) func(e *exampleEnv) []string {
	return func(*exampleEnv) []string { return replace }
}

// passwordServer starts a Redis of the test's own whose password is
// "...", and returns its address.
func passwordServer(e *exampleEnv) string {
	srv := redistest.Spawn(e.t)
	if err := redistest.NewClient(e.t, srv.Addr).ConfigSet(context.Background(), "requirepass", "...").Err(); err != nil {
		e.t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "..."})
	e.t.Cleanup(func() { _ = rdb.Close() })
	e.rdb = rdb
	return srv.Addr
}

// helpExampleRuns are the runs of each example of the help, by its text
// as helpExamples returns it.
var helpExampleRuns = map[string][]exampleRun{
	// lock --help
	`redisync lock backup -- ./backup.sh --full`: {{
		check: func(e *exampleEnv, p *proc) { e.ranWithToken("backup.sh --full", schema.LockKeys(e.prefix, "backup")) },
	}},
	`redisync lock --wait 30s deploy -- make deploy`: {
		{what: "free", check: func(e *exampleEnv, p *proc) { e.ranWithToken("make deploy", schema.LockKeys(e.prefix, "deploy")) }},
		{what: "held", setup: withLockHeld("deploy", "--wait 30s", "--wait 300ms"), code: exitTimeout,
			check: func(e *exampleEnv, p *proc) { e.didNotRun("make") }},
	},
	`redisync lock -n cron-job -- ./job.sh || [ $? -eq 73 ]`: {
		{what: "free", check: func(e *exampleEnv, p *proc) { e.ranWithToken("job.sh", schema.LockKeys(e.prefix, "cron-job")) }},
		{what: "held", setup: withLockHeld("cron-job"), check: func(e *exampleEnv, p *proc) { e.didNotRun("job.sh") }},
	},
	`redisync lock -n --busy-exit 200 cron-job -- ./job.sh || [ $? -eq 200 ]`: {
		{what: "free", check: func(e *exampleEnv, p *proc) { e.ranWithToken("job.sh", schema.LockKeys(e.prefix, "cron-job")) }},
		{what: "held", setup: withLockHeld("cron-job"), check: func(e *exampleEnv, p *proc) { e.didNotRun("job.sh") }},
	},
	`redisync lock deploy > /tmp/deploy.lock & holder=$!
until [ -s /tmp/deploy.lock ]; do sleep 0.1; done
read key token < /tmp/deploy.lock
./step1.sh "$token"; ./step2.sh "$token"
kill $holder; wait $holder`: {{
		setup: replacing("/tmp/deploy.lock", "deploy.lock"), // in the run's own directory
		check: func(e *exampleEnv, p *proc) {
			keys := schema.LockKeys(e.prefix, "deploy")
			token := e.lastToken(keys)
			for _, step := range []string{"step1.sh", "step2.sh"} {
				if lines := e.ran(step); len(lines) != 1 || !strings.HasPrefix(lines[0], step+" "+token+" ") {
					e.t.Errorf("%s ran %q; want it once with the token %s", step, lines, token)
				}
			}
			if len(holdIDs(e.t, e.rdb, keys.Hash)) != 0 {
				e.t.Error("the lock is still held after its holder was killed")
			}
		},
	}},
	`redisync lock --lease 5m migrate -- ./migrate.sh`: {{
		during: func(e *exampleEnv, p *proc) {
			waitFor(e.t, "migrate.sh to run", func() bool { return len(e.ran("migrate.sh")) > 0 || p.exited() })
			st, now := lockState(e.t, e.rdb, schema.LockKeys(e.prefix, "migrate").Hash)
			if ttl := time.Duration(st.End-now) * time.Millisecond; ttl <= 4*time.Minute || ttl > 5*time.Minute {
				e.t.Errorf("the lock's lease while migrate.sh runs: %v, want at most 5m", ttl)
			}
		},
		check: func(e *exampleEnv, p *proc) { e.ranWithToken("migrate.sh", schema.LockKeys(e.prefix, "migrate")) },
	}},
	`REDISYNC_PASSWORD=... redisync lock --redis rediss://redis.example.com:6380 job -- \
    sh -c 'curl -H "Fencing-Token: $REDISYNC_TOKEN" https://example.com/write'`: {
		// On a server of the test's own whose password is "...", without
		// TLS; the rest of the line runs as shown.
		{what: "the password from the environment", setup: func(e *exampleEnv) []string {
			return []string{"rediss://redis.example.com:6380", "redis://" + passwordServer(e)}
		}, check: func(e *exampleEnv, p *proc) {
			e.ranWithToken("curl -H Fencing-Token: "+e.lastToken(schema.LockKeys(e.prefix, "job"))+" https://example.com/write",
				schema.LockKeys(e.prefix, "job"))
		}},
		{what: "no password", code: exitUnavailable, setup: func(e *exampleEnv) []string {
			return []string{"rediss://redis.example.com:6380", "redis://" + passwordServer(e), "REDISYNC_PASSWORD=... ", ""}
		}, check: func(e *exampleEnv, p *proc) { e.didNotRun("curl") }},
	},
	`redisync lock --redis 10.0.0.1:7000,10.0.0.2:7000 report -- ./report.sh`: {{
		setup: func(e *exampleEnv) []string {
			cl := redistest.SpawnCluster(e.t, 3, 0)
			e.rdb = cl.NewClient(e.t)
			return []string{"10.0.0.1:7000,10.0.0.2:7000", cl.Addrs()[0] + "," + cl.Addrs()[1]}
		},
		check: func(e *exampleEnv, p *proc) { e.ranWithToken("report.sh", schema.LockKeys(e.prefix, "report")) },
	}},
	`redisync lock --redis redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster report -- ./report.sh`: {{
		setup: func(e *exampleEnv) []string {
			primary := redistest.Spawn(e.t)
			s1, s2 := redistest.SpawnSentinel(e.t, "mymaster", primary.Addr), redistest.SpawnSentinel(e.t, "mymaster", primary.Addr)
			e.rdb = redistest.NewClient(e.t, primary.Addr)
			return []string{"10.0.0.1:26379,10.0.0.2:26379", s1.Addr + "," + s2.Addr}
		},
		check: func(e *exampleEnv, p *proc) { e.ranWithToken("report.sh", schema.LockKeys(e.prefix, "report")) },
	}},

	// sem --help
	`redisync sem --limit 4 encode -- ffmpeg -i in.mov out.mp4`: {{
		check: func(e *exampleEnv, p *proc) {
			if lines := e.ran("ffmpeg"); len(lines) != 1 || !strings.HasPrefix(lines[0], "ffmpeg -i in.mov out.mp4 ") ||
				!strings.Contains(lines[0], " name=encode ") || !strings.HasSuffix(lines[0], " permits=1") {
				e.t.Errorf("ffmpeg ran %q; want it once with 1 permit of encode", lines)
			}
		},
	}},
	`redisync sem --limit 8 --permits 3 --wait 10m gpus -- ./train.sh`: {
		{what: "free", check: func(e *exampleEnv, p *proc) {
			if lines := e.ran("train.sh"); len(lines) != 1 || !strings.HasSuffix(lines[0], " permits=3") {
				e.t.Errorf("train.sh ran %q; want it once with 3 permits", lines)
			}
		}},
		{what: "6 of 8 held", code: exitTimeout, setup: func(e *exampleEnv) []string {
			e.holdPermits("gpus", 8, 6)
			return []string{"--wait 10m", "--wait 300ms"}
		}, check: func(e *exampleEnv, p *proc) { e.didNotRun("train.sh") }},
	},
	`redisync status gpus`: {{
		setup: func(e *exampleEnv) []string { e.holdPermits("gpus", 8, 3); return nil },
		check: stdoutHas(`semaphore "gpus"`, "5 available of 8"),
	}},
	`redisync sem --limit 8 --resize 12 gpus`: {{
		setup: func(e *exampleEnv) []string {
			e.holdPermits("gpus", 8, 2) // stores the size 8
			return nil
		},
		check: func(e *exampleEnv, p *proc) {
			st, err := e.client.InspectSemaphore(context.Background(), "gpus")
			if err != nil || st.Size != 12 || st.Available() != 10 {
				e.t.Errorf("after the resize: %+v, %v; want 10 of 12 permits available", st, err)
			}
		},
	}},

	// elect --help
	`redisync elect --value "$(hostname):8080" scheduler -- ./scheduler`: {{
		check: func(e *exampleEnv, p *proc) {
			host, _ := os.Hostname()
			if line := e.ranWithToken("scheduler", schema.ElectionKeys(e.prefix, "scheduler")); !strings.Contains(line, " value="+host+":8080 ") {
				e.t.Errorf("scheduler ran as %q; want the value %s:8080", line, host)
			}
		},
	}},
	`redisync elect -n --busy-exit 200 report -- ./report.sh || [ $? -eq 200 ]`: {
		{what: "no leader", check: func(e *exampleEnv, p *proc) { e.ranWithToken("report.sh", schema.ElectionKeys(e.prefix, "report")) }},
		{what: "another leads", setup: func(e *exampleEnv) []string { e.lead("report", "elsewhere"); return nil },
			check: func(e *exampleEnv, p *proc) { e.didNotRun("report.sh") }},
	},
	`redisync status scheduler`: {
		{what: "a leader", setup: func(e *exampleEnv) []string { e.lead("scheduler", "10.0.0.7:8080"); return nil },
			check: stdoutHas(`election "scheduler"`, `"10.0.0.7:8080"`)},
		{what: "nobody", code: exitFree},
	},

	// status --help
	`redisync status backup`: {
		{what: "held", setup: withLockHeld("backup"), check: stdoutHas(`lock "backup"`, "fencing token")},
		{what: "free", code: exitFree, check: stdoutHas(`lock "backup"`, "none (free)")},
	},
	`redisync status --redis redis://10.0.0.5:6379/2 deploy`: {{
		setup: func(e *exampleEnv) []string {
			db2 := redis.NewClient(&redis.Options{Addr: redistest.Addr(e.t), DB: 2})
			e.t.Cleanup(func() { _ = db2.Close() })
			c, err := redisync.New(db2, redisync.WithKeyPrefix(e.prefix))
			if err != nil {
				e.t.Fatal(err)
			}
			e.t.Cleanup(func() { _ = c.Close() })
			m := must(c.NewMutex("deploy"))
			if err := m.Lock(context.Background()); err != nil {
				e.t.Fatal(err)
			}
			e.t.Cleanup(func() { _ = m.Unlock(context.Background()) })
			return []string{"10.0.0.5:6379", redistest.Addr(e.t)}
		},
		check: stdoutHas(`lock "deploy"`, "fencing token"), // held in database 2 only
	}},
	`redisync status --json deploy | jq -r '.lock.holder.owner // "free"'`: {
		{what: "free", check: stdoutIs("free\n")},
		{what: "held", setup: withLockHeld("deploy"), check: func(e *exampleEnv, p *proc) {
			st, err := e.client.InspectLock(context.Background(), "deploy")
			if err != nil || st.Holder == nil || p.stdout.String() != st.Holder.ID+"\n" {
				e.t.Errorf("stdout %q; want the holder of %+v, %v", p.stdout.String(), st, err)
			}
		}},
	},
	`if redisync status backup >/dev/null; then echo "a backup runs"; fi`: {
		{what: "held", setup: withLockHeld("backup"), check: stdoutIs("a backup runs\n")},
		{what: "free", check: stdoutIs("")},
	},
	`redisync status --watch deploy`: {{
		during: func(e *exampleEnv, p *proc) {
			waitFor(e.t, "two readings", func() bool { return strings.Count(p.stdout.String(), `lock "deploy"`) >= 2 || p.exited() })
			// Ctrl-C: SIGINT to the foreground process group.
			if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT); err != nil {
				e.t.Fatal(err)
			}
		},
		check: stdoutHas("every 1s (Ctrl-C to stop)"),
	}},
	`redisync status --json gpus | jq '.semaphore.available'`: {{
		setup: func(e *exampleEnv) []string { e.holdPermits("gpus", 8, 3); return nil },
		check: stdoutIs("5\n"),
	}},
	`redisync status --verbose deploy`: {{
		code: exitFree,
		check: func(e *exampleEnv, p *proc) {
			if !regexp.MustCompile(`^server (redis|valkey) [0-9.]+ \(standalone primary\)\n`).MatchString(p.stdout.String()) {
				e.t.Errorf("stdout %q; want the server named first", p.stdout.String())
			}
		},
	}},

	`redisync status --all --limit 20`: {
		{what: "two held", setup: func(e *exampleEnv) []string {
			e.holdLock("deploy")
			e.holdPermits("gpus", 8, 3)
			return nil
		}, check: func(e *exampleEnv, p *proc) {
			out := p.stdout.String()
			if !regexp.MustCompile(`(?m)^lock +"deploy" `).MatchString(out) || !regexp.MustCompile(`(?m)^semaphore +"gpus" .*5 of 8 free`).MatchString(out) {
				e.t.Errorf("stdout:\n%s\nwant the lock deploy and the semaphore gpus", out)
			}
		}},
		{what: "nothing", check: stdoutHas("nothing held or waited for")},
	},

	// demo --help, cut short
	`redisync demo`: {{
		embedded: true,
		setup:    replacing("redisync demo", "redisync demo --duration 1s"),
		check:    demoPassed("embedded Redis"),
	}},
	`redisync demo --duration 20s --clients 8 --workers 4`: {{
		embedded: true,
		setup:    replacing("--duration 20s", "--duration 3s"),
		check:    demoPassed("embedded Redis"),
	}},
	`redisync demo --plain | tee demo.log`: {{
		embedded: true,
		setup:    replacing("--plain", "--plain --duration 1s"),
		check: func(e *exampleEnv, p *proc) {
			b, err := os.ReadFile(filepath.Join(e.dir, "demo.log"))
			if err != nil || string(b) != p.stdout.String() {
				e.t.Errorf("demo.log: %v; want what the demo printed", err)
			}
			for _, l := range strings.Split(string(b), "\n") {
				if utf8.RuneCountInString(l) > plainWidth {
					e.t.Errorf("a line wider than %d columns: %q", plainWidth, l)
				}
			}
			demoPassed("embedded Redis")(e, p)
		},
	}},
	`redisync demo --duration 20s --metrics-out demo.csv`: {{
		embedded: true,
		setup:    replacing("--duration 20s", "--duration 1s"),
		check: func(e *exampleEnv, p *proc) {
			b, err := os.ReadFile(filepath.Join(e.dir, "demo.csv"))
			if err != nil || !strings.HasPrefix(string(b), metricsHeader) || strings.Count(string(b), ",mutex,") == 0 {
				e.t.Errorf("demo.csv: %v, %q; want the figures as CSV", err, b)
			}
			demoPassed("embedded Redis")(e, p)
		},
	}},
	`redisync demo --redis redis://localhost:6379 --duration 1m`: {{
		embedded: true,
		setup: func(e *exampleEnv) []string {
			return []string{"localhost:6379", redistest.Addr(e.t), "--duration 1m", "--duration 1s"}
		},
		check: func(e *exampleEnv, p *proc) { demoPassed("Redis at redis://"+redistest.Addr(e.t))(e, p) },
	}},
}

// redisyncCommand matches a redisync command in an example, for --prefix.
var redisyncCommand = regexp.MustCompile(`(^|[\s;&|(])redisync (lock|sem|elect|status|demo) `)

// runExample runs one run of an example with sh, in an environment of
// its own, and checks it.
func runExample(t *testing.T, example string, r exampleRun) {
	e := newExampleEnv(t)
	script := example
	if r.setup != nil {
		replace := r.setup(e)
		for i := 0; i+1 < len(replace); i += 2 {
			if !strings.Contains(script, replace[i]) {
				t.Fatalf("the example has no %q to replace", replace[i])
			}
			script = strings.ReplaceAll(script, replace[i], replace[i+1])
		}
	}
	script = redisyncCommand.ReplaceAllString(script, "${1}redisync $2 --prefix "+e.prefix+" ")
	// As an interactive shell leaves SIGINT to its foreground job, the
	// shell ignores it: a Ctrl-C, sent to the process group, reaches the
	// example's commands alone.
	cmd := exec.Command("sh", "-c", "trap '' INT\n"+script)
	cmd.Dir = e.dir
	addr := redistest.Addr(t)
	if r.embedded {
		addr = ""
	}
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(e.dir, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"REDIS_URL=", "REDIS_ADDR="+addr, "EXAMPLE_LOG="+e.log)
	hold := filepath.Join(e.dir, "go on")
	if r.during != nil {
		cmd.Env = append(cmd.Env, "EXAMPLE_HOLD="+hold)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := startCmd(t, cmd, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	if r.during != nil {
		r.during(e, p)
		if err := os.WriteFile(hold, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if code := p.wait(t); code != r.code {
		t.Errorf("exit %d, want %d\nscript:\n%s\nstdout:\n%s\nstderr:\n%s", code, r.code, script, p.stdout.String(), p.stderr.String())
	}
	if r.check != nil {
		r.check(e, p)
	}
}

// TestHelpExamples runs every example of "redisync help" and of each
// command's --help, and checks that it does what the help says. A new
// example needs its runs in helpExampleRuns.
func TestHelpExamples(t *testing.T) {
	redistest.Addr(t)
	_, top := runCode(t, "", "help")
	helps := map[string]string{"help": top.stdout.String()}
	for _, m := range regexp.MustCompile(`(?m)^  redisync ([a-z]+) `).FindAllStringSubmatch(top.stdout.String(), -1) {
		if m[1] == "help" || m[1] == "version" {
			continue
		}
		code, p := runCode(t, "", m[1], "--help")
		if code != exitOK {
			t.Fatalf("%s --help: exit %d", m[1], code)
		}
		helps[m[1]] = p.stdout.String()
	}
	if len(helps) < 6 {
		t.Fatalf("commands found in redisync help: %q", slices.Collect(maps.Keys(helps)))
	}
	seen := map[string]bool{}
	for _, cmd := range slices.Sorted(maps.Keys(helps)) {
		for _, ex := range helpExamples(helps[cmd]) {
			seen[ex] = true
			runs, ok := helpExampleRuns[ex]
			if !ok {
				t.Errorf("%s: the example %q has no runs in helpExampleRuns", cmd, ex)
				continue
			}
			for _, r := range runs {
				name := strings.ReplaceAll(strings.SplitN(ex, "\n", 2)[0], "/", "_") // a "/" would nest subtests
				t.Run(cmd+"/"+name+"/"+cmp.Or(r.what, "as shown"), func(t *testing.T) { runExample(t, ex, r) })
			}
		}
	}
	for ex := range helpExampleRuns {
		if !seen[ex] {
			t.Errorf("helpExampleRuns has runs of %q, which no help shows", ex)
		}
	}
}
