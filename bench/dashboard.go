package main

// The dashboard of docs/operations.md: "go generate ./bench" runs the demo
// on the embedded Redis for 20 s, writing its live figures, then draws
// them with -dashboard.
//
//go:generate go run ../cmd/redisync demo --plain --duration 20s --clients 4 --workers 3 --metrics-out ../docs/dashboard.csv
//go:generate go run . -dashboard ../docs/dashboard.csv

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// demoFigures are the columns of "redisync demo --metrics-out" for one
// primitive, row by row.
type demoFigures struct {
	elapsed, waiting, p50, p99, rate, lost []float64
}

// writeDashboard reads the figures that "redisync demo --metrics-out"
// wrote to path and draws them, as a dashboard built on the same metrics
// would, into path with its extension replaced by ".svg": the calls
// waiting, the wait p50 and p99, and acquisitions per second with the
// holds lost, per primitive, in three panels stacked in one SVG.
func writeDashboard(path string) error {
	figs, order, err := readDemoFigures(path)
	if err != nil {
		return err
	}
	secs := axis{label: "time since the demo started (s)", format: func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }}
	count := func(label string) axis {
		return axis{label: label, format: func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }}
	}
	waiting := lineChart{title: "Calls waiting (redisync.lock.waiters)", x: secs, y: count("Lock / Acquire calls under way")}
	wait := lineChart{title: "Wait for the lock, last second (redisync.lock.wait.duration)", x: secs,
		y: axis{label: "wait (ms, log scale)", log: true, format: func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }}}
	rate := lineChart{title: "Acquisitions per second, and holds lost (redisync.lock.holds.lost)", x: secs, y: count("per second; lost: total")}
	for i, prim := range order {
		f := figs[prim]
		waiting.series = append(waiting.series, series{name: prim, colour: palette[1+i], x: f.elapsed, y: f.waiting})
		wait.series = append(wait.series,
			series{name: prim + " p50", colour: palette[1+2*i], x: f.elapsed, y: f.p50},
			series{name: prim + " p99", colour: palette[2+2*i], x: f.elapsed, y: f.p99})
		rate.series = append(rate.series,
			series{name: prim + " acq/s", colour: palette[1+2*i], x: f.elapsed, y: f.rate},
			series{name: prim + " lost", colour: palette[2+2*i], x: f.elapsed, y: f.lost})
	}
	out := strings.TrimSuffix(path, ".csv") + ".svg"
	return os.WriteFile(out, stack(waiting, wait, rate), 0o644)
}

// readDemoFigures reads a --metrics-out file: the figures by primitive,
// and the primitives in the order they first appear.
func readDemoFigures(path string) (map[string]*demoFigures, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	rows, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) < 2 || strings.Join(rows[0], ",") != "elapsed_s,primitive,waiting,wait_p50_ms,wait_p99_ms,acquisitions_per_s,lost" {
		return nil, nil, fmt.Errorf("%s: not the figures of redisync demo --metrics-out", path)
	}
	figs := map[string]*demoFigures{}
	var order []string
	for _, row := range rows[1:] {
		var v [7]float64
		for i, cell := range row {
			if i == 1 {
				continue
			}
			if v[i], err = strconv.ParseFloat(cell, 64); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", path, err)
			}
		}
		f := figs[row[1]]
		if f == nil {
			f = &demoFigures{}
			figs[row[1]] = f
			order = append(order, row[1])
		}
		f.elapsed = append(f.elapsed, v[0])
		f.waiting = append(f.waiting, v[2])
		f.p50 = append(f.p50, v[3])
		f.p99 = append(f.p99, v[4])
		f.rate = append(f.rate, v[5])
		f.lost = append(f.lost, v[6])
	}
	return figs, order, nil
}

// stack draws charts one above the other in one SVG document.
func stack(charts ...lineChart) []byte {
	w := newSVG(chartWidth, chartHeight*len(charts))
	for i, c := range charts {
		doc := string(c.svg())
		doc = doc[strings.Index(doc, "<svg "):] // no XML declaration inside
		fmt.Fprintf(&w.b, "<svg y=\"%d\" %s", i*chartHeight, strings.TrimPrefix(doc, "<svg "))
	}
	return w.close()
}
