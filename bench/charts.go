package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// writeCharts writes the SVG charts into dir: one latency distribution per
// scenario, and the scale series' commands and throughput per waiter
// count.
func writeCharts(dir string, results []result) error {
	charts := map[string]lineChart{}
	for _, sc := range scenarioNames(results) {
		last := headline(results, sc)
		if len(last) == 0 || sc == floorScenario {
			continue
		}
		charts["wait-"+sc+".svg"] = latencyChart(sc, last)
	}
	if series := scaleSeries(results); len(series) > 0 {
		charts["scale-cmds.svg"] = scaleChart(series, "Commands sent per acquisition as waiters grow (scale)",
			"commands sent per acquisition (cmds/acq)", true, func(r result) float64 { return r.cmds })
		charts["scale-calls.svg"] = scaleChart(series, "Commands Redis ran per acquisition, scripts' included (scale)",
			"commands executed per acquisition (calls/acq)", true, func(r result) float64 { return r.calls })
		charts["scale-rate.svg"] = scaleChart(series, "Acquisitions per second as waiters grow (scale)",
			"acquisitions/s", false, func(r result) float64 { return r.rate })
	}
	for name, c := range charts {
		if err := os.WriteFile(filepath.Join(dir, name), c.svg(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// latencyChart plots the cumulative distribution of the wait for the lock
// per library, or of Lock+Unlock for the uncontended scenario.
func latencyChart(scenario string, results []result) lineChart {
	title := fmt.Sprintf("%s (%s): time from calling Lock to holding, CDF", scenario, results[0].label())
	if scenario == "uncontended" {
		title = "uncontended: Lock + Unlock latency, CDF"
	}
	c := lineChart{
		title: title,
		x:     axis{label: "latency (log scale)", log: true, format: func(v float64) string { return fmtTick(time.Duration(v)) }},
		y: axis{label: "fraction of acquisitions", ticks: []float64{0, 0.25, 0.5, 0.75, 1},
			format: func(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) }},
	}
	for _, r := range results {
		d := r.wait
		if scenario == "uncontended" {
			d = r.op
		}
		s := series{name: r.library, colour: libraryColour(r.library)}
		for _, p := range d.cdf() {
			s.x, s.y = append(s.x, float64(p.value)), append(s.y, p.fraction)
		}
		c.series = append(c.series, s)
	}
	return c
}

// scaleChart plots one figure of the scale series against the number of
// waiters, one line per library that has something to show (the limit
// sends no command: it has no place on a log axis).
func scaleChart(bySeries []libSeries, title, ylabel string, logY bool, figure func(result) float64) lineChart {
	c := lineChart{
		title: title,
		x:     axis{label: "waiters on the lock (log scale)", log: true, format: func(v float64) string { return fmt.Sprintf("%g", v) }},
		y:     axis{label: ylabel, log: logY, format: func(v float64) string { return fmt.Sprintf("%g", v) }},
	}
	seen := map[int]bool{}
	for _, ls := range bySeries {
		s := series{name: ls.library, colour: libraryColour(ls.library)}
		for _, r := range ls.results {
			s.x, s.y = append(s.x, float64(r.goroutines)), append(s.y, figure(r))
			if !seen[r.goroutines] {
				seen[r.goroutines] = true
				c.x.ticks = append(c.x.ticks, float64(r.goroutines))
			}
		}
		if logY {
			s.y = positive(s.y)
		}
		if slices.ContainsFunc(s.y, func(v float64) bool { return !math.IsNaN(v) }) {
			c.series = append(c.series, s)
		}
	}
	return c
}

// positive replaces values a log axis cannot show with NaN.
func positive(v []float64) []float64 {
	for i := range v {
		if v[i] <= 0 {
			v[i] = math.NaN()
		}
	}
	return v
}

// fmtTick formats a duration for an axis: fmtDur without trailing zeros.
func fmtTick(d time.Duration) string {
	s := fmtDur(d)
	unit := strings.TrimLeft(s, "0123456789.")
	num := s[:len(s)-len(unit)]
	if strings.Contains(num, ".") {
		num = strings.TrimRight(strings.TrimRight(num, "0"), ".")
	}
	return num + unit
}

// libraryColour gives every library the same colour in every chart, by
// its place in libraries(), whichever libraries a chart leaves out.
func libraryColour(name string) string {
	i := slices.IndexFunc(libraries(), func(l library) bool { return l.name == name })
	if i < 0 {
		return ""
	}
	return palette[i%len(palette)]
}
