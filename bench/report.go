package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// legend explains the tables' columns.
const legend = `Columns:
  floor      the Redis's own floor, measured at the start of every round with a go-redis
             client, one round trip after another: PING, EVALSHA of a script that only
             returns, and PUBLISH→deliver (from sending a PUBLISH to a subscriber's
             goroutine, on a connection of its own, having read the message); cpu/op: the
             Redis CPU time each isolated round trip took (the PUBLISH's request and its
             delivery), sys/op its system (kernel) part; under load a request can cost
             Redis less
  acq/s      acquisitions per second in the window; xlim: divided by the in-process limit's
  cmds/acq   commands the clients sent per acquisition: an EVAL/EVALSHA is one, the
             commands its script runs are not counted. Counted in the clients (go-redis
             hooks; for rueidis a wrapper of Do/DoMulti), plus the (UN)SUBSCRIBE calls of
             INFO commandstats, which pub/sub connections send past the hooks; a new
             connection's handshake (HELLO, CLIENT SETINFO) is not counted
  calls/acq  commands Redis executed per acquisition: INFO commandstats calls, the
             commands run inside Lua scripts included (the design notes' bar counts so)
  req/acq    requests per acquisition, counted in the clients: a command or a pipeline is
             one, as a round trip; rueidis auto-pipelines concurrent requests, so its
             requests may share round trips
  dlv/acq    messages Redis pushed to the clients per acquisition: pub/sub messages and
             client-side-caching invalidations (rueidislock's wake-ups), counted as they come
             off every client connection's socket (their RESP headers), whether or not the
             library then wakes anyone
  subs/acq   SUBSCRIBE and UNSUBSCRIBE calls (plain, sharded or by pattern) per acquisition,
             from INFO commandstats
  cpu/acq    Redis CPU time (used_cpu_user + used_cpu_sys) per acquisition; xrs: divided by
             redsync's; sys/acq: its system part (used_cpu_sys), the kernel's work for the
             requests and deliveries (sockets, wake-ups), whatever the commands do; Linux
             samples the user/system split at each timer tick, so it is coarse
  lua/acq    the scripts' run time in Redis per acquisition: the usec of FCALL, EVALSHA
             and EVAL in INFO commandstats (part of cpu/acq)
  ccpu/acq   the benchmark process's CPU time per acquisition: every client of the run
             and the harness (the limit's figure is the harness's share)
  wait       from calling Lock to holding; p99 xlim: divided by the limit's p99
  gap        from one holder's release to the next holder's acquisition (one process clock);
             xpub: gap p50 divided by the floor's PUBLISH→deliver p50 (not for cold: its
             locks are taken seconds apart)
  hold       p50 of the holds as they lasted, from Lock's return to the call of Unlock: the
             same for every library, as the hold sleeps in nanosleep (see hold_linux.go)
  Jain       Jain's fairness index over the goroutines' acquisition counts (1 = equal)
  viol       mutual-exclusion violations (must be 0); errs: failed Lock/Unlock calls
  conns      most Redis client connections during the window, the benchmark's own excluded
  bg/s       requests per second the libraries sent outside Lock and Unlock calls: watchdog
             renewals and fair waiters' heartbeats (redisync), keep-alive extensions
             (rueidislock); a request made with the context of no call in progress (go-redis
             clients), or with that of a call that returned (rueidislock)
  left       keys of the run still in Redis, with a TTL, once its clients closed (summed
             over rounds); a key without a TTL fails the benchmark
  With several rounds, every figure is the median of the rounds' own, and every ratio
  the median of the rounds' ratios (each round's figure over the same round's); viol,
  errs and left are summed, conns is the most. The CDF charts and waits.csv pool the
  rounds' samples; results.csv has one row per round.
  uncontended: op = Lock + Unlock; p50 xrl: op p50 divided by redislock-10ms's
  The benchmark's own INFO commands are subtracted from the server's counts. In the
  cluster scenario the server's figures (calls, cpu, (S)SUBSCRIBE, conns) are summed
  over the primaries, and a client-side request is one call of the cluster client.`

// A libSeries is one library's results over the steps of a series.
type libSeries struct {
	library string
	results []result
}

// scenarioNames lists the scenarios present in results, in run order.
func scenarioNames(results []result) []string {
	var names []string
	for _, r := range results {
		if !slices.Contains(names, r.scenario) {
			names = append(names, r.scenario)
		}
	}
	return names
}

// headline returns the results of a scenario's last (largest) step.
func headline(results []result, scenario string) []result {
	most := 0
	for _, r := range results {
		if r.scenario == scenario {
			most = max(most, r.goroutines)
		}
	}
	var picked []result
	for _, r := range results {
		if r.scenario == scenario && r.goroutines == most {
			picked = append(picked, r)
		}
	}
	return picked
}

// scaleSeries groups the scale scenario's results by library, in order.
func scaleSeries(results []result) []libSeries {
	var out []libSeries
	for _, r := range results {
		if r.scenario != "scale" {
			continue
		}
		i := slices.IndexFunc(out, func(s libSeries) bool { return s.library == r.library })
		if i < 0 {
			i = len(out)
			out = append(out, libSeries{library: r.library})
		}
		out[i].results = append(out[i].results, r)
	}
	return out
}

// printReport writes one table per scenario, the scale series and the
// legend.
func printReport(w io.Writer, results []result, about map[string]string) {
	floor := findRow(headline(results, floorScenario), floorPublish)
	for _, sc := range scenarioNames(results) {
		rows := headline(results, sc)
		if sc == floorScenario {
			printFloor(w, rows)
			continue
		}
		fmt.Fprintf(w, "\n== %s: %s, %.1f s window in all%s\n", sc, rows[0].label(), rows[0].seconds, roundsNote(rows[0]))
		if sc == "uncontended" {
			printUncontended(w, rows)
		} else {
			printContended(w, rows, floor)
		}
	}
	if series := scaleSeries(results); len(series) > 0 && len(series[0].results) > 1 {
		printSeries(w, series, "cmds/acq", func(r result) string { return fmtNum(r.cmds, 2) })
		printSeries(w, series, "calls/acq", func(r result) string { return fmtNum(r.calls, 1) })
		printSeries(w, series, "cpu/acq", func(r result) string { return fmtMicros(r.cpu) })
		printSeries(w, series, "bg/s", func(r result) string { return fmtNum(r.background, 1) })
		printSeries(w, series, "acq/s", func(r result) string { return fmtNum(r.rate, 0) })
		printSeries(w, series, "wait p99", func(r result) string { return midDur(r, waitAt(0.99)) })
	}
	fmt.Fprintln(w, "\nLibraries:")
	for _, lib := range libraries() {
		if text, ok := about[lib.name]; ok {
			fmt.Fprintf(w, "  %-15s %s\n", lib.name, text)
		}
	}
	fmt.Fprintln(w, legend)
}

// Figures of one result, for medians of quantiles and of ratios over the
// rounds (midQuantile, midRatio).
var (
	rateOf  = func(r result) float64 { return r.rate }
	cpuOf   = func(r result) float64 { return r.cpu }
	waitMax = func(r result) time.Duration { return r.wait.max }
	opMax   = func(r result) time.Duration { return r.op.max }
)

// waitAt, opAt, gapAt and heldAt return the figure of the quantile q of
// the wait, the operation, the gap and the hold as it lasted.
func waitAt(q float64) func(result) time.Duration {
	return func(r result) time.Duration { return r.wait.quantile(q) }
}

func opAt(q float64) func(result) time.Duration {
	return func(r result) time.Duration { return r.op.quantile(q) }
}

func gapAt(q float64) func(result) time.Duration {
	return func(r result) time.Duration { return r.gap.quantile(q) }
}

func heldAt(q float64) func(result) time.Duration {
	return func(r result) time.Duration { return r.held.quantile(q) }
}

// inSeconds turns a duration figure into a ratio's figure.
func inSeconds(figure func(result) time.Duration) func(result) float64 {
	return func(r result) float64 { return figure(r).Seconds() }
}

// printFloor writes the floor's table: one row per figure.
func printFloor(w io.Writer, rows []result) {
	fmt.Fprintf(w, "\n== floor: round trips to Redis one after another, %d per round%s\n", floorSamples, roundsNote(rows[0]))
	t := [][]string{{"round trip", "p50", "p99", "max", "cpu/op", "sys/op", "samples"}}
	for _, r := range rows {
		t = append(t, []string{r.library, midDur(r, opAt(0.5)), midDur(r, opAt(0.99)), midDur(r, opMax),
			fmtMicros(r.cpu), fmtMicros(r.sys), strconv.FormatInt(r.acquisitions, 10)})
	}
	writeTable(w, t)
}

// printContended writes the table of a scenario with waiters; floor is
// the floor's PUBLISH→deliver.
func printContended(w io.Writer, rows []result, floor result) {
	limit, rs := findRow(rows, "limit"), findRow(rows, "redsync")
	t := [][]string{{"library", "acq/s", "xlim", "cmds/acq", "calls/acq", "req/acq", "dlv/acq", "subs/acq", "cpu/acq", "xrs", "sys/acq", "lua/acq", "ccpu/acq",
		"wait p50", "p99", "p99 xlim", "max", "gap p50", "xpub", "gap p99", "hold", "Jain", "viol", "errs", "conns", "bg/s", "left"}}
	for _, r := range rows {
		t = append(t, []string{r.library, fmtNum(r.rate, 0), fmtRatio(midRatio(r, limit, rateOf, rateOf)),
			fmtNum(r.cmds, 2), fmtNum(r.calls, 2), fmtNum(r.requests, 2), fmtNum(r.delivers, 2), fmtNum(r.subs, 2),
			fmtMicros(r.cpu), fmtRatio(midRatio(r, rs, cpuOf, cpuOf)), fmtMicros(r.sys), fmtMicros(r.lua), fmtMicros(r.ccpu),
			midDur(r, waitAt(0.5)), midDur(r, waitAt(0.99)), fmtRatio(midRatio(r, limit, inSeconds(waitAt(0.99)), inSeconds(waitAt(0.99)))),
			midDur(r, waitMax), midDur(r, gapAt(0.5)), fmtRatio(midRatio(r, floor, inSeconds(gapAt(0.5)), inSeconds(opAt(0.5)))),
			midDur(r, gapAt(0.99)), midDur(r, heldAt(0.5)), fmtNum(r.jain, 3), strconv.FormatInt(r.violations, 10), strconv.FormatInt(r.errors, 10),
			fmtConns(r.conns), fmtNum(r.background, 1), strconv.FormatInt(r.left, 10)})
	}
	writeTable(w, t)
	printErrors(w, rows)
}

// printUncontended writes the table of the single-goroutine scenario.
func printUncontended(w io.Writer, rows []result) {
	rl := findRow(rows, "redislock-10ms")
	t := [][]string{{"library", "ops/s", "op p50", "p50 xrl", "op p99", "op max", "Lock p50", "cmds/op", "calls/op", "req/op",
		"dlv/op", "cpu/op", "sys/op", "lua/op", "ccpu/op", "errs", "bg/s", "left"}}
	for _, r := range rows {
		t = append(t, []string{r.library, fmtNum(r.rate, 0),
			midDur(r, opAt(0.5)), fmtRatio(midRatio(r, rl, inSeconds(opAt(0.5)), inSeconds(opAt(0.5)))), midDur(r, opAt(0.99)),
			midDur(r, opMax), midDur(r, waitAt(0.5)), fmtNum(r.cmds, 2), fmtNum(r.calls, 2), fmtNum(r.requests, 2),
			fmtNum(r.delivers, 2), fmtMicros(r.cpu), fmtMicros(r.sys), fmtMicros(r.lua), fmtMicros(r.ccpu), strconv.FormatInt(r.errors, 10),
			fmtNum(r.background, 1), strconv.FormatInt(r.left, 10)})
	}
	writeTable(w, t)
	printErrors(w, rows)
}

// midDur formats the median over r's rounds of a duration figure.
func midDur(r result, figure func(result) time.Duration) string {
	return fmtDur(midQuantile(r, figure))
}

// roundsNote says, for a table's title, what its figures are of.
func roundsNote(r result) string {
	if r.rounds > 1 {
		return fmt.Sprintf(" (median of %d rounds)", r.rounds)
	}
	return ""
}

// printSeries writes one figure of the scale series: a row per library,
// a column per waiter count.
func printSeries(w io.Writer, series []libSeries, name string, cell func(result) string) {
	fmt.Fprintf(w, "\n== scale series: %s by number of waiters\n", name)
	head := []string{"library"}
	for _, r := range series[0].results {
		head = append(head, strconv.Itoa(r.goroutines))
	}
	t := [][]string{head}
	for _, s := range series {
		row := []string{s.library}
		for _, r := range s.results {
			row = append(row, cell(r))
		}
		t = append(t, row)
	}
	writeTable(w, t)
}

// printErrors writes the first error of each library that had any.
func printErrors(w io.Writer, rows []result) {
	for _, r := range rows {
		if r.errors > 0 {
			fmt.Fprintf(w, "  %s: %d errors, the first: %s\n", r.library, r.errors, r.firstError)
		}
	}
}

// findRow returns library's result among rows, or a zero result (whose
// ratios print as "-") when it did not run.
func findRow(rows []result, library string) result {
	for _, r := range rows {
		if r.library == library {
			return r
		}
	}
	return result{}
}

// sample lists the first few of keys, and how many more there are.
func sample(keys []string) string {
	const shown = 5
	if len(keys) <= shown {
		return strings.Join(keys, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(keys[:shown], ", "), len(keys)-shown)
}

// writeTable writes rows as aligned columns: the first left-aligned, the
// others right-aligned, with a rule under the header. A row with more or
// fewer cells than the header is a bug in the caller: it panics.
func writeTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		if len(row) != len(widths) {
			panic(fmt.Sprintf("a row of %d cells under a header of %d: %q", len(row), len(widths), row))
		}
		for i, cell := range row {
			widths[i] = max(widths[i], len([]rune(cell)))
		}
	}
	for n, row := range rows {
		var sb strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", widths[i]-len([]rune(cell)))
			if i == 0 {
				sb.WriteString(cell + pad)
			} else {
				sb.WriteString("  " + pad + cell)
			}
		}
		fmt.Fprintln(w, sb.String())
		if n == 0 {
			fmt.Fprintln(w, strings.Repeat("-", len([]rune(sb.String()))))
		}
	}
}

// fmtNum formats v with the given decimals, "n/a" for NaN.
func fmtNum(v float64, decimals int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// fmtRatio formats a ratio as "0.93x", or "-" for NaN.
func fmtRatio(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmtNum(v, 2) + "x"
}

// fmtMicros formats a number of microseconds as a duration.
func fmtMicros(us float64) string {
	if math.IsNaN(us) {
		return "n/a"
	}
	return fmtDur(time.Duration(us * 1e3))
}

// fmtConns formats a connection count, "-" when none was sampled.
func fmtConns(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// fmtDur formats d with three significant digits; "-" when negative (no
// samples).
func fmtDur(d time.Duration) string {
	f := func(v float64, unit string) string {
		switch {
		case v >= 99.95:
			return strconv.FormatFloat(v, 'f', 0, 64) + unit
		case v >= 9.995:
			return strconv.FormatFloat(v, 'f', 1, 64) + unit
		}
		return strconv.FormatFloat(v, 'f', 2, 64) + unit
	}
	switch {
	case d < 0:
		return "-"
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "ns"
	case d < time.Millisecond:
		return f(float64(d)/1e3, "µs")
	case d < time.Second:
		return f(float64(d)/1e6, "ms")
	}
	return f(float64(d)/1e9, "s")
}

// writeCSV writes into dir results.csv, one row per run of every round
// (runs), and waits.csv, the wait percentiles of every run with its rounds
// pooled (pooled).
func writeCSV(dir string, runs, pooled []result) error {
	rows := [][]string{{"round", "scenario", "library", "clients", "goroutines", "keys", "hold_ms", "size", "seconds",
		"acquisitions", "acq_per_s", "cmds_per_acq", "calls_per_acq", "requests_per_acq", "deliveries_per_acq", "subscriptions_per_acq",
		"cpu_us_per_acq", "client_cpu_us_per_acq", "wait_p50_us", "wait_p99_us", "wait_max_us", "op_p50_us", "op_p99_us",
		"gap_p50_us", "gap_p50_x_publish_floor", "gap_p99_us", "jain", "violations", "errors", "conns",
		"background_per_s", "keys_left", "keys_without_ttl", "hold_p50_us", "sys_us_per_acq"}}
	waits := [][]string{{"scenario", "library", "goroutines", "percentile", "wait_us"}}
	us := func(d time.Duration) string {
		if d < 0 {
			return ""
		}
		return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64)
	}
	num := func(v float64) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'g', 6, 64)
	}
	floors := map[int]time.Duration{} // PUBLISH→deliver p50 by round
	for _, r := range runs {
		if r.scenario == floorScenario && r.library == floorPublish {
			floors[r.round] = r.op.quantile(0.5)
		}
	}
	for _, r := range runs {
		gap := r.gap.quantile(0.5)
		rows = append(rows, []string{strconv.Itoa(r.round + 1), r.scenario, r.library, strconv.Itoa(r.clients), strconv.Itoa(r.goroutines),
			strconv.Itoa(r.keys), num(float64(r.hold) / 1e6), strconv.FormatInt(r.size, 10), num(r.seconds),
			strconv.FormatInt(r.acquisitions, 10), num(r.rate), num(r.cmds), num(r.calls), num(r.requests), num(r.delivers), num(r.subs),
			num(r.cpu), num(r.ccpu), us(r.wait.quantile(0.5)), us(r.wait.quantile(0.99)), us(r.wait.max), us(r.op.quantile(0.5)), us(r.op.quantile(0.99)),
			us(gap), num(perFloor(gap, floors[r.round])), us(r.gap.quantile(0.99)), num(r.jain),
			strconv.FormatInt(r.violations, 10), strconv.FormatInt(r.errors, 10), strconv.Itoa(r.conns),
			num(r.background), strconv.FormatInt(r.left, 10), strings.Join(r.persistent, " "), us(r.held.quantile(0.5)), num(r.sys)})
	}
	for _, r := range pooled {
		if r.scenario == floorScenario {
			continue
		}
		for _, p := range []float64{1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100} {
			waits = append(waits, []string{r.scenario, r.library, strconv.Itoa(r.goroutines),
				strconv.FormatFloat(p, 'g', -1, 64), us(r.wait.quantile(p / 100))})
		}
	}
	if err := writeCSVFile(filepath.Join(dir, "results.csv"), rows); err != nil {
		return err
	}
	return writeCSVFile(filepath.Join(dir, "waits.csv"), waits)
}

// perFloor returns d divided by the floor f; NaN without either.
func perFloor(d, f time.Duration) float64 {
	if d < 0 || f <= 0 {
		return math.NaN()
	}
	return float64(d) / float64(f)
}

// writeCSVFile writes records to the file at path.
func writeCSVFile(path string, records [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	cw.WriteAll(records)
	if err := cw.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
