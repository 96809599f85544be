package main

import (
	"bytes"
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReportRowsMatchTheirHeaders prints every kind of table and the CSV
// files from results whose figures are all set, and checks that every row
// has its header's number of cells (writeTable panics otherwise; the csv
// reader fails on a record of another length) and that the kernel's CPU
// is in each.
func TestReportRowsMatchTheirHeaders(t *testing.T) {
	mk := func(scenario, library string, goroutines int, sys float64) result {
		d := distOf(time.Millisecond, 2*time.Millisecond)
		return result{scenario: scenario, library: library, shape: shape{clients: 1, goroutines: goroutines, keys: 1},
			seconds: 1, acquisitions: 2, rate: 2, cmds: 2, calls: 4, requests: 2, cpu: 50, sys: sys, ccpu: 60,
			wait: d, op: d, gap: d, held: d, jain: 1, rounds: 1}
	}
	results := []result{
		mk(floorScenario, floorPing, 1, 11.5), mk(floorScenario, floorEvalsha, 1, 12.5), mk(floorScenario, floorPublish, 1, 13.5),
		mk("hot", "limit", 8, 0), mk("hot", "redisync", 8, 21.5), mk("hot", "redsync", 8, 22.5),
		mk("uncontended", "redislock-10ms", 1, 31.5), mk("uncontended", "redisync", 1, 32.5),
	}
	var out bytes.Buffer
	printReport(&out, results, nil)
	for _, sys := range []string{"11.5µs", "13.5µs", "21.5µs", "22.5µs", "32.5µs"} {
		if !strings.Contains(out.String(), sys) {
			t.Errorf("the report has no %s (a sys figure):\n%s", sys, out.String())
		}
	}

	dir := t.TempDir()
	if err := writeCSV(dir, results, results); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	records, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("results.csv: %v", err)
	}
	header := records[0]
	col := len(header) - 1
	if header[col] != "sys_us_per_acq" {
		t.Fatalf("results.csv's last column is %q, want sys_us_per_acq", header[col])
	}
	if len(records) != 1+len(results) || records[5][col] != "21.5" {
		t.Fatalf("results.csv has %d records, redisync's hot sys %q; want %d and 21.5", len(records), records[5][col], 1+len(results))
	}
}
