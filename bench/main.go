// Command bench measures redisync side by side with its peers (redsync,
// bsm/redislock, rueidislock) and the in-process limit (sync.Mutex,
// semaphore.Weighted) on one redis-server, one library after another, in
// the scenarios of the design notes: a hot lock, its scaling to a thousand
// waiters, the uncontended fast path, many locks at once, and a semaphore.
// redisync-layout2 is redisync's fair Mutex of layout 2, frozen in
// internal/layout2, to set beside the current layout in one run (it runs
// the lock scenarios on one server only).
//
// Usage:
//
//	go run . [-redis ADDR] [-libs LIST] [-scenarios LIST] [-p N] [-g N] [-hold D] [-d D] [-rounds N] [-quick] [-out DIR]
//
// Without -redis it starts redis-server on a free loopback port and stops
// it at exit. With -rounds N every run is repeated N times, the libraries
// taking turns in a rotated order each round, and the rounds are pooled. Progress goes to stderr, the tables to stdout, and with -out
// the CSV files and SVG charts to DIR.
//
// With -dashboard FILE it only draws the figures that "redisync demo
// --metrics-out FILE" wrote, as a dashboard (FILE with .svg in place of
// .csv): "go generate ./bench" makes docs/dashboard.svg.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// options are the command line.
type options struct {
	redis, redisServer string
	redisCli           string
	libs, scenarios    string
	out                string
	settle             time.Duration
	rounds             int
	cpuprofile         string
	dashboard          string // a demo's figures to draw, instead of benchmarking
	settings
}

func main() {
	opts := parseFlags()
	if opts.dashboard != "" {
		if err := writeDashboard(opts.dashboard); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := bench(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

// parseFlags reads the command line.
func parseFlags() options {
	var o options
	names := func(n []string) string { return strings.Join(n, ",") }
	var libNames, scNames []string
	for _, l := range libraries() {
		libNames = append(libNames, l.name)
	}
	for _, sc := range scenarios() {
		scNames = append(scNames, sc.name)
	}
	flag.StringVar(&o.redis, "redis", "", "address of the Redis to use (default: start redis-server on a free loopback port)")
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "the redis-server binary started when -redis is not given")
	flag.StringVar(&o.redisCli, "redis-cli", "redis-cli", "the redis-cli binary that joins the cluster scenario's nodes")
	flag.StringVar(&o.libs, "libs", "all", "comma-separated libraries: "+names(libNames))
	flag.StringVar(&o.scenarios, "scenarios", "all", "comma-separated scenarios: "+names(scNames)+"; all: every one but cluster")
	flag.IntVar(&o.clients, "p", 0, "client instances (connection pools, as processes) (default: each scenario's own)")
	flag.IntVar(&o.perClient, "g", 0, "goroutines per client in hot, hot0, semaphore and rw, per client and lock in cluster (default: each scenario's own)")
	flag.DurationVar(&o.hold, "hold", 0, "how long a holder keeps the lock (default: each scenario's own)")
	flag.DurationVar(&o.base, "d", 8*time.Second, "the hot scenario's measuring window; the others' scale from it")
	quick := flag.Bool("quick", false, "a run of about a minute: -d 1.5s unless -d is given")
	flag.StringVar(&o.out, "out", "", "directory for the CSV files and SVG charts (created if needed)")
	flag.DurationVar(&o.settle, "settle", 300*time.Millisecond, "pause between runs")
	flag.IntVar(&o.rounds, "rounds", 1, "run everything this many times, the libraries' order rotated each round, and pool the rounds")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the benchmark process (every client) to this file")
	flag.StringVar(&o.dashboard, "dashboard", "", "instead of benchmarking, draw the figures that \"redisync demo --metrics-out FILE\" wrote to FILE as a dashboard, FILE.svg")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "hold":
			o.holdSet = true
		case "d":
			*quick = false
		}
	})
	if *quick {
		o.base = 1500 * time.Millisecond
	}
	return o
}

// A job is one library in one step of one scenario.
type job struct {
	scenario string
	cluster  bool // on the Redis Cluster
	shape    shape
	lib      library
	round    int
}

// plan lists the jobs in run order: round by round, scenario by scenario,
// step by step, every library in turn (in an order rotated by one place
// each round). Libraries without a semaphore sit out the semaphore
// scenario, those without a cluster client the cluster scenario; "all"
// scenarios are those not on a cluster.
func plan(o options) ([]job, error) {
	if o.rounds < 1 {
		return nil, fmt.Errorf("-rounds %d: want at least 1", o.rounds)
	}
	libs, err := selectLibraries(o.libs)
	if err != nil {
		return nil, fmt.Errorf("-libs: %w", err)
	}
	scs, err := selectByName(o.scenarios, scenarios(), func(sc scenario) string { return sc.name })
	if err != nil {
		return nil, fmt.Errorf("-scenarios: %w", err)
	}
	if o.scenarios == "all" {
		scs = slices.DeleteFunc(scs, func(sc scenario) bool { return sc.cluster })
	}
	var jobs []job
	for round := range o.rounds {
		for _, sc := range scs {
			for _, s := range sc.shapes(o.settings) {
				for _, lib := range rotate(libs, round) {
					if (s.size == 0 || lib.semaphores) && (!s.rw || lib.rwmutexes) && (!sc.cluster || lib.openCluster != nil) {
						jobs = append(jobs, job{scenario: sc.name, cluster: sc.cluster, shape: s, lib: lib, round: round})
					}
				}
			}
		}
	}
	if len(jobs) == 0 {
		return nil, errors.New("nothing to run: no library selected has what the scenarios selected need")
	}
	return jobs, nil
}

// bench runs the jobs on one Redis and reports.
func bench(ctx context.Context, o options) (err error) {
	jobs, err := plan(o)
	if err != nil {
		return err
	}
	var planned time.Duration
	for _, j := range jobs {
		planned += j.shape.warmup + j.shape.measure + o.settle
	}
	fmt.Fprintf(os.Stderr, "%d runs, about %v\n", len(jobs), planned.Round(time.Second))

	// Every key of this invocation contains token.
	token := "rsbench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var tg targets
	defer func() {
		pattern := ""
		if o.redis != "" {
			pattern = "*" + token + "*"
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if cerr := tg.close(ctx, pattern); err == nil {
			err = cerr
		}
	}()
	if err := tg.open(ctx, o, jobs); err != nil {
		return err
	}

	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	m := machine{server: tg.any().version(ctx), loadBefore: loadAverage()}
	results, err := runJobs(ctx, tg, jobs, token, o.settle)
	if err != nil {
		return err
	}
	m.loadAfter = loadAverage()
	pooled := pool(results)
	fmt.Fprintln(os.Stdout, "machine:", m)
	about := map[string]string{}
	for _, j := range jobs {
		about[j.lib.name] = j.lib.about
	}
	printReport(os.Stdout, pooled, about)
	if o.out == "" {
		return persistentKeys(results)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if err := writeCSV(o.out, results, pooled); err != nil {
		return err
	}
	if err := writeCharts(o.out, pooled); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote CSV and SVG files to %s\n", o.out)
	return persistentKeys(results)
}

// persistentKeys returns an error naming the keys without a TTL that
// runs left in Redis, if any.
func persistentKeys(results []result) error {
	var errs []error
	for _, r := range results {
		if len(r.persistent) > 0 {
			errs = append(errs, fmt.Errorf("%s %s left %d keys without a TTL: %s", r.scenario, r.library, len(r.persistent), sample(r.persistent)))
		}
	}
	return errors.Join(errs...)
}

// targets are the Redis servers of an invocation: the one server of the
// scenarios on one, and the cluster of the cluster scenario; each is nil
// when no job needs it.
type targets struct{ single, cluster *target }

// open connects to, or starts, the targets the jobs need.
func (tg *targets) open(ctx context.Context, o options, jobs []job) error {
	if slices.ContainsFunc(jobs, func(j job) bool { return !j.cluster }) {
		var srv *server
		var err error
		if o.redis != "" {
			srv, err = connectServer(ctx, o.redis)
		} else {
			srv, err = startServer(o.redisServer)
		}
		if err != nil {
			return err
		}
		tg.single = single(srv)
		fmt.Fprintf(os.Stderr, "redis at %s\n", tg.single)
	}
	if slices.ContainsFunc(jobs, func(j job) bool { return j.cluster }) {
		c, err := startCluster(ctx, o.redisServer, o.redisCli, clusterPrimaries)
		if err != nil {
			return err
		}
		tg.cluster = c
		fmt.Fprintf(os.Stderr, "redis: %s\n", tg.cluster)
	}
	return nil
}

// any returns one of the targets that are open.
func (tg *targets) any() *target {
	if tg.single != nil {
		return tg.single
	}
	return tg.cluster
}

// close closes the targets that are open: pattern (when not empty) names
// the keys to remove from a server the benchmark did not start.
func (tg *targets) close(ctx context.Context, pattern string) error {
	var errs []error
	if tg.single != nil {
		errs = append(errs, tg.single.close(ctx, pattern))
	}
	if tg.cluster != nil {
		errs = append(errs, tg.cluster.close(ctx, ""))
	}
	return errors.Join(errs...)
}

// runJobs measures every job in turn, pausing settle between them, and
// the floor (measureFloor) at the start of every round, on the first
// server of the first target.
func runJobs(ctx context.Context, tg targets, jobs []job, token string, settle time.Duration) ([]result, error) {
	prog := newProgress(os.Stderr, len(jobs))
	rounds := jobs[len(jobs)-1].round + 1
	var results []result
	for i, j := range jobs {
		prefix := ""
		if rounds > 1 {
			prefix = fmt.Sprintf("round %d/%d: ", j.round+1, rounds)
		}
		if i == 0 || j.round != jobs[i-1].round {
			floor, err := measureFloor(ctx, tg.any().nodes[0], token+":floor")
			if err != nil {
				return nil, fmt.Errorf("floor: %w", err)
			}
			for k := range floor {
				floor[k].round = j.round
			}
			prog.floor(prefix, floor)
			results = append(results, floor...)
		}
		label := fmt.Sprintf("%s%s %s %s", prefix, j.scenario, j.shape.label(), j.lib.name)
		prog.start(label)
		planned := j.shape.warmup + j.shape.measure
		key := fmt.Sprintf("%s:%s:%d:%s:%d", token, j.scenario, j.shape.goroutines, j.lib.name, j.round)
		t := tg.single
		if j.cluster {
			t = tg.cluster
		}
		res, err := measure(ctx, t, j.lib, j.shape, key, func(elapsed time.Duration, acquired int64) {
			prog.update(elapsed, planned, acquired)
		})
		if err == nil {
			res.left, res.persistent, err = t.leftovers(ctx, key)
		}
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", j.scenario, j.lib.name, err)
		}
		res.scenario, res.library, res.round = j.scenario, j.lib.name, j.round
		prog.finish(res)
		results = append(results, res)
		if i < len(jobs)-1 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(settle):
			}
		}
	}
	return results, nil
}
