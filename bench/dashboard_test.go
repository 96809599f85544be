package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The dashboard stacks three well-formed charts, one line per primitive
// and figure, from a demo's --metrics-out file; anything else is refused.
func TestDashboard(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "demo.csv")
	data := "elapsed_s,primitive,waiting,wait_p50_ms,wait_p99_ms,acquisitions_per_s,lost\n" +
		"0.5,mutex,3,10.000,20.000,40.0,0\n0.5,semaphore,2,5.000,9.000,60.0,0\n" +
		"1.0,mutex,4,12.000,25.000,44.0,1\n1.0,semaphore,1,6.000,8.000,62.0,0\n"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeDashboard(path); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(dir, "demo.svg"))
	if err != nil {
		t.Fatal(err)
	}
	text := parseSVG(t, doc)
	for _, want := range []string{"Calls waiting", "Wait for the lock", "holds lost", "mutex p99", "semaphore acq/s"} {
		if !strings.Contains(text, want) {
			t.Errorf("dashboard lacks %q", want)
		}
	}
	if n := strings.Count(string(doc), "<svg "); n != 4 {
		t.Errorf("%d svg elements, want 4 (the page and three charts)", n)
	}

	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("a,b\n1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeDashboard(bad); err == nil {
		t.Error("a file that is not the demo's was drawn")
	}
}
