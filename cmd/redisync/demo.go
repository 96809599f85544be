package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

const demoHelp = `Usage: redisync demo [flags]

Watch simulated clients contend for a fair lock, a semaphore, a
read-write lock, a multi-lock and an election. The demo starts an
embedded, in-process Redis (unless --redis, $REDIS_URL or $REDIS_ADDR
names a real one) and --clients redisync Clients, standing for as many
processes, each with --workers goroutines that take the fair lock NAME,
hold it for a few milliseconds, let go and come back; as many that do the
same with 1 or 2 of the 3 permits of the semaphore NAME; as many that read
the read-write lock NAME, or one time in 5 write it; as many that move
money between two of 4 accounts (NAME:acct1 to NAME:acct4) under a
multi-lock of both, named in a random order; and each client is a
candidate in the election NAME, leading a while and resigning, followed
by an observer. The terminal shows, live, who holds the lock and the
permits and who waits, in queue order, read from Redis as "redisync
status" reads it.

After --duration (or Ctrl-C) it prints a summary: acquisitions per client,
the longest wait, how evenly the lock was shared, and checks that no two
workers ever held the lock at once, that fencing tokens only grew, that
never more than 3 permits were in use, that no reader was ever beside a
writer nor two writers together, that no account was in two transfers at
once and no money was lost, that the election had one leader at a time,
that every worker (lock, multi-lock) and every client (semaphore,
read-write lock, election) got its turn and that nothing was left in
Redis. Exit 0 when every check passes, 70 when one fails.

Live figures come from the library's Observer (what an application would
export with the module github.com/redisync/redisync/redisyncotel): per primitive,
the Lock or Acquire calls waiting, the wait p50 and p99 of the last
second's acquisitions, their rate, and the holds lost. --metrics-out FILE
writes them as CSV at every refresh, for a dashboard (docs/operations.md).

When stdout is not a terminal (or with --plain) it prints the progress
every half second instead of redrawing: a few lines per primitive, none
wider than 100 columns.

Examples:
  # 5 seconds on an embedded Redis; exit 0 when every check passed
  redisync demo

  # more contention, for longer
  redisync demo --duration 20s --clients 8 --workers 4

  # progress lines instead of the live view, kept in a file
  redisync demo --plain | tee demo.log

  # the live figures as CSV, for a dashboard
  redisync demo --duration 20s --metrics-out demo.csv

  # on a real Redis; "redisync status demo" in another terminal shows the same
  redisync demo --redis redis://localhost:6379 --duration 1m
`

// demoEnv is what the parts of a demo share.
type demoEnv struct {
	rdb     redis.UniversalClient
	prefix  string
	name    string
	clients []*redisync.Client
	workers int
	hold    time.Duration // longest simulated hold
	labels  *labeler
	stats   *demoStats // the clients' observer
}

// demoPart is one primitive shown by the demo: the fair lock
// (demo_lock.go), the semaphore (demo_sem.go), the read-write lock
// (demo_rw.go), the multi-lock (demo_multi.go) and the election
// (demo_elect.go).
type demoPart interface {
	// title names the primitive, for the header.
	title(env *demoEnv) string
	// primitive is the kind of primitive, whose live figures follow
	// the part's view.
	primitive() redisync.Primitive
	// start starts the part's workers in wg; they stop when ctx ends.
	start(ctx context.Context, env *demoEnv, wg *sync.WaitGroup)
	// view returns the part's lines of the live view of st.
	view(st *Status, lab *labeler) []string
	// brief returns the part's text in the plain progress (see wrap).
	brief(st *Status, lab *labeler) string
	// summary writes the part's results to w after the workers stopped,
	// and returns its checks. st is read after everything was closed.
	summary(w io.Writer, elapsed time.Duration, st *Status) []check
}

// demoParts make the parts of a demo, in display order.
var demoParts = []func() demoPart{newLockPart, newSemPart, newRWPart, newMultiPart, newElectPart}

// check is the outcome of one of the demo's checks.
type check struct {
	ok   bool
	text string
}

func runDemo(args []string) int {
	fs := newFlags("demo")
	redisURL := redisFlag(fs)
	duration := durationFlag(fs, "duration", 5*time.Second, "how long to run before the summary (a `duration`, e.g. 20s)")
	clients := fs.Int("clients", 4, "`number` of redisync Clients (simulated processes)")
	workers := fs.Int("workers", 2, "`number` of goroutines per client and primitive, each with its own Mutex or Semaphore")
	hold := durationFlag(fs, "hold", 30*time.Millisecond, "longest simulated hold (a `duration`); each hold takes a random time up to it")
	name := fs.String("name", "demo", "`name` of the lock, the semaphore, the read-write lock and the election")
	prefix := fs.String("prefix", "redisync", "key `prefix` of the Redis keys")
	plain := fs.Bool("plain", false, "print progress lines, even on a terminal")
	metricsOut := fs.String("metrics-out", "", "write the live figures to `file` as CSV at every refresh")
	p, err := parseArgs(fs, demoHelp, args)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	switch {
	case err != nil:
	case len(p.pos) > 0 || p.dashdash:
		err = fmt.Errorf("unexpected argument %q", strings.Join(append(p.pos, p.cmd...), " "))
	case *duration <= 0:
		err = fmt.Errorf("--duration %v must be positive", *duration)
	case *clients < 1 || *clients > 64:
		err = fmt.Errorf("--clients %d must be in [1, 64]", *clients)
	case *workers < 1 || *workers > 64:
		err = fmt.Errorf("--workers %d must be in [1, 64]", *workers)
	case *hold < time.Millisecond:
		err = fmt.Errorf("--hold %v must be at least 1ms", *hold)
	case checkPrefix(*prefix) != nil:
		err = checkPrefix(*prefix)
	default:
		err = checkName(*name)
	}
	if err != nil {
		return usageError("demo", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	where := "embedded Redis"
	t := resolveTarget(*redisURL)
	var rdb redis.UniversalClient
	if t.spec == "" {
		var mr *miniredis.Miniredis
		if mr, err = miniredis.Run(); err != nil {
			return errorf(exitSoftware, "cannot start the embedded Redis: %v", err)
		}
		defer mr.Close()
		defer runClock(mr)()
		t = target{mr.Addr(), "embedded"}
	} else {
		where = "Redis at " + redact(t.spec)
	}
	if rdb, err = connect(ctx, t); err != nil {
		return connectExit(err)
	}
	defer func() { _ = rdb.Close() }()

	env := &demoEnv{
		rdb: rdb, prefix: *prefix, name: *name,
		workers: *workers, hold: *hold, labels: newLabeler(), stats: newDemoStats(),
	}
	for range *clients {
		c, err := redisync.New(rdb, redisync.WithKeyPrefix(*prefix), redisync.WithObserver(env.stats))
		if err != nil {
			return errorf(exitSoftware, "%v", err)
		}
		defer func() { _ = c.Close() }()
		env.clients = append(env.clients, c)
	}
	d := &demo{env: env, duration: *duration, where: where}
	for _, newPart := range demoParts {
		d.parts = append(d.parts, newPart())
	}
	d.width, d.live = terminalWidth(os.Stdout)
	d.live = d.live && !*plain && os.Getenv("TERM") != "dumb"
	if *metricsOut != "" {
		f, err := os.Create(*metricsOut)
		if err != nil {
			return errorf(exitUsage, "--metrics-out: %v", err)
		}
		defer f.Close()
		d.metrics = bufio.NewWriter(f)
		defer d.metrics.Flush()
		_, _ = d.metrics.WriteString(metricsHeader)
	}
	return d.run(ctx)
}

// runClock moves the embedded Redis's clock, which only runs when told
// to, along with the real one, so that leases and hand-offs expire in
// it. The returned func stops it and waits for it.
func runClock(mr *miniredis.Miniredis) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// demo is one run of the demo.
type demo struct {
	env      *demoEnv
	parts    []demoPart
	duration time.Duration
	where    string
	live     bool          // redraw in place; else print progress lines
	width    int           // of the terminal, when live
	drawn    int           // lines of the last frame drawn
	metrics  *bufio.Writer // --metrics-out, if given
}

// run runs the workers for d.duration or until ctx ends, shows them
// meanwhile, and prints the summary. It returns the exit code.
func (d *demo) run(ctx context.Context) int {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, d.duration)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range d.parts {
		p.start(wctx, d.env, &wg)
	}
	titles := make([]string, len(d.parts))
	for i, p := range d.parts {
		titles[i] = p.title(d.env)
	}
	header := fmt.Sprintf("redisync demo: %d clients x %d workers contend for %s on %s for %v",
		len(d.env.clients), d.env.workers, strings.Join(titles, " and "), d.where, d.duration)
	width := plainWidth
	if d.live && d.width > 0 {
		width = d.width
	}
	fmt.Fprintln(os.Stdout, strings.Join(wrap(header, width, "", "  "), "\n"))
	if d.live {
		fmt.Fprint(os.Stdout, "\x1b[?25l") // hide the cursor while redrawing
		defer fmt.Fprint(os.Stdout, "\x1b[?25h")
	}
	d.show(wctx, start)
	wg.Wait()
	elapsed := time.Since(start)
	for _, c := range d.env.clients {
		_ = c.Close()
	}

	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	st, err := readStatus(rctx, d.env.rdb, d.env.prefix, d.env.name, false)
	if err != nil {
		return errorf(errorCode(err), "cannot read the final state: %v", err)
	}
	return d.summary(elapsed, st, ctx.Err() != nil)
}

// show draws the live view (or prints progress lines) until ctx ends.
func (d *demo) show(ctx context.Context, start time.Time) {
	every := 100 * time.Millisecond
	if !d.live {
		every = 500 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if d.live {
				d.frame(start) // the last state, with the queue drained
			}
			return
		case <-tick.C:
			d.frame(start)
		}
	}
}

// frame reads the status once and draws it.
func (d *demo) frame(start time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := readStatus(ctx, d.env.rdb, d.env.prefix, d.env.name, false)
	now := time.Now()
	live := d.env.stats.snapshot(now)
	if d.metrics != nil {
		prims := make([]redisync.Primitive, len(d.parts))
		for i, p := range d.parts {
			prims[i] = p.primitive()
		}
		_ = writeFigures(d.metrics, now.Sub(start), prims, live)
	}
	elapsed := now.Sub(start).Round(100 * time.Millisecond)
	if !d.live {
		if err != nil {
			fmt.Fprintf(os.Stdout, "%6v  cannot read the status: %v\n", elapsed, err)
			return
		}
		var b strings.Builder
		for i, p := range d.parts {
			first := strings.Repeat(" ", 8)
			if i == 0 {
				first = fmt.Sprintf("%6v  ", elapsed)
			}
			text := p.brief(st, d.env.labels) + live[p.primitive()].brief()
			for _, l := range wrap(text, plainWidth, first, strings.Repeat(" ", 10)) {
				b.WriteString(l)
				b.WriteString("\n")
			}
		}
		fmt.Fprint(os.Stdout, b.String())
		return
	}
	lines := []string{"", progressBar(elapsed, d.duration), ""}
	if err != nil {
		lines = append(lines, "  cannot read the status: "+err.Error())
	} else {
		for _, p := range d.parts {
			lines = append(lines, p.view(st, d.env.labels)...)
			lines = append(lines, live[p.primitive()].line(), "")
		}
	}
	var b strings.Builder
	if d.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", d.drawn) // back to the frame's first line
	}
	b.WriteString("\x1b[J") // clear the old frame
	for _, l := range lines {
		b.WriteString(clip(l, d.width))
		b.WriteString("\n")
	}
	fmt.Fprint(os.Stdout, b.String())
	d.drawn = len(lines)
}

// summary prints the results and checks and returns the exit code.
func (d *demo) summary(elapsed time.Duration, st *Status, interrupted bool) int {
	out := os.Stdout
	how := "ran"
	if interrupted {
		how = "interrupted after"
	}
	fmt.Fprintf(out, "\nsummary: %s %v\n", how, elapsed.Round(10*time.Millisecond))
	var checks []check
	for _, p := range d.parts {
		checks = append(checks, p.summary(out, elapsed, st)...)
		if d.env != nil { // nil in tests of the checks alone
			checks = append(checks, d.figures(out, p.primitive()))
		}
	}
	fmt.Fprintln(out, "\nchecks:")
	failed := 0
	for _, c := range checks {
		mark := "ok  "
		if !c.ok {
			mark, failed = "FAIL", failed+1
		}
		fmt.Fprintf(out, "  %s  %s\n", mark, c.text)
	}
	switch {
	case failed > 0:
		return errorf(exitSoftware, "%d of %d checks failed", failed, len(checks))
	case interrupted:
		fmt.Fprintln(out, "all checks passed (interrupted)")
		return exitSignal + int(syscall.SIGINT)
	}
	fmt.Fprintln(out, "all checks passed")
	return exitOK
}

// figures prints the observed waits of prim over the run, and checks
// that no hold was lost.
func (d *demo) figures(w io.Writer, prim redisync.Primitive) check {
	p50, p99, lost := d.env.stats.overall(prim)
	fmt.Fprintf(w, "  observed wait of the acquisitions: p50 %s, p99 %s; holds lost %d\n", msText(p50), msText(p99), lost)
	what := "lock"
	switch prim {
	case redisync.PrimitiveSemaphore:
		what = "semaphore"
	case redisync.PrimitiveRWMutex:
		what = "rwmutex"
	case redisync.PrimitiveMultiMutex:
		what = "multi-lock"
	case redisync.PrimitiveElection:
		what = "election"
	}
	return check{lost == 0, fmt.Sprintf("%s: no hold lost (%d lost)", what, lost)}
}

// progressBar draws how far the demo has run.
func progressBar(elapsed, total time.Duration) string {
	const width = 30
	n := min(width, int(float64(width)*float64(elapsed)/float64(total)))
	return fmt.Sprintf("  %5.1fs / %.1fs  [%s%s]", elapsed.Seconds(), total.Seconds(),
		strings.Repeat("#", n), strings.Repeat(".", width-n))
}

// plainWidth is the most columns of a line of the progress that the demo
// prints when it does not redraw (--plain, or stdout not a terminal).
const plainWidth = 100

// wrap breaks text into lines of at most width runes at its spaces, the
// first line starting with first, the others with rest. A word too long
// for a line is cut.
func wrap(text string, width int, first, rest string) []string {
	var lines []string
	line, n, empty := first, len([]rune(first)), true
	for _, w := range strings.Fields(text) {
		r := []rune(w)
		if !empty && n+1+len(r) > width {
			lines = append(lines, line)
			line, n, empty = rest, len([]rune(rest)), true
		}
		if !empty {
			line, n = line+" ", n+1
		}
		for n+len(r) > width { // a word longer than a line
			cut := max(width-n, 1)
			lines = append(lines, line+string(r[:cut]))
			r = r[cut:]
			line, n = rest, len([]rune(rest))
		}
		line, n, empty = line+string(r), n+len(r), false
	}
	return append(lines, line)
}

// clip cuts s to width runes (0: no limit).
func clip(s string, width int) string {
	r := []rune(s)
	if width <= 0 || len(r) < width {
		return s
	}
	return string(r[:width-1])
}

// labeler names owner ids ("<label>/<client uuid>-<n>") after the simulated
// clients and workers ("c2.w1"), once a worker has told which is its own.
// It is safe for concurrent use.
type labeler struct {
	mu      sync.Mutex
	owners  map[string]string // owner id -> "c2.w1"
	clients map[string]string // client part of owner ids -> "c2"
}

func newLabeler() *labeler {
	return &labeler{owners: map[string]string{}, clients: map[string]string{}}
}

// learn records that owner is worker w of client c (both from 1).
func (l *labeler) learn(owner string, c, w int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owners[owner] = fmt.Sprintf("c%d.w%d", c, w)
	if i := strings.LastIndexByte(owner, '-'); i > 0 {
		l.clients[owner[:i]] = fmt.Sprintf("c%d", c)
	}
}

// name returns the name of owner: "c2.w1", or "c2#5" for an owner of a
// known client, or a shortened id.
func (l *labeler) name(owner string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.owners[owner]; ok {
		return s
	}
	i := strings.LastIndexByte(owner, '-')
	if i > 0 {
		n := owner[i+1:] // the number, then '.' and the ticket's random part
		if j := strings.IndexByte(n, '.'); j >= 0 {
			n = n[:j]
		}
		if c, ok := l.clients[owner[:i]]; ok {
			return c + "#" + n
		}
		if i > 8 {
			return owner[:8] + "…-" + n
		}
	}
	return owner
}

// maxOf returns the largest of xs, or 0.
func maxOf[T int64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}

// rate is n per second over d.
func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return math.NaN()
	}
	return float64(n) / d.Seconds()
}
