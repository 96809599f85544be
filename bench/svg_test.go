package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// parseSVG checks that doc is well-formed XML with an svg root and
// returns its character data.
func parseSVG(t *testing.T, doc []byte) string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var text strings.Builder
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, doc)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
		case xml.CharData:
			text.Write(tok)
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return text.String()
}

func TestChartIsWellFormedXML(t *testing.T) {
	c := lineChart{
		title: `waits <for> "locks" & more`,
		x:     axis{label: "latency", log: true, format: func(v float64) string { return fmtDur(time.Duration(v)) }},
		y:     axis{label: "fraction", format: func(v float64) string { return fmtNum(v, 2) }},
		series: []series{
			{name: "a<b>&c", x: []float64{1e3, 1e5, 1e7}, y: []float64{0.1, 0.5, 1}},
			{name: "gaps", x: []float64{1e4, math.NaN(), 0, 2e6}, y: []float64{0.2, 0.4, 0.6, 0.9}},
			{name: "one point", x: []float64{5e4}, y: []float64{0.3}},
			{name: "empty"},
		},
	}
	text := parseSVG(t, c.svg())
	for _, want := range []string{`waits <for> "locks" & more`, "a<b>&c", "gaps", "fraction"} {
		if !strings.Contains(text, want) {
			t.Errorf("text %q missing from the chart", want)
		}
	}
}

func TestEmptyChartIsWellFormedXML(t *testing.T) {
	c := lineChart{
		title: "nothing",
		x:     axis{label: "x", log: true, ticks: []float64{32, 1024}, format: func(v float64) string { return fmtNum(v, 0) }},
		y:     axis{label: "y", log: true, format: func(v float64) string { return fmtNum(v, 0) }},
	}
	parseSVG(t, c.svg())
}

func TestAxisFit(t *testing.T) {
	a := axis{log: true}
	a.fit([]float64{3e3, 4e6})
	if a.lo != 1e3 || a.hi != 1e7 {
		t.Errorf("log axis range [%v, %v], want [1e3, 1e7]", a.lo, a.hi)
	}
	if p := a.position(1e5); math.Abs(p-0.5) > 1e-9 {
		t.Errorf("position(1e5) = %v, want 0.5", p)
	}
	b := axis{}
	b.fit([]float64{0.3, 7.2})
	if b.lo != 0 || b.hi < 7.2 || len(b.ticks) < 3 {
		t.Errorf("linear axis [%v, %v] ticks %v", b.lo, b.hi, b.ticks)
	}
}

func TestFmtTick(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10 * time.Microsecond:   "10µs",
		time.Millisecond:        "1ms",
		2500 * time.Microsecond: "2.5ms",
		100 * time.Millisecond:  "100ms",
		10 * time.Second:        "10s",
		500:                     "500ns",
	} {
		if got := fmtTick(d); got != want {
			t.Errorf("fmtTick(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestLibraryColourIsStableAcrossCharts(t *testing.T) {
	hot := shape{clients: 4, goroutines: 32, keys: 1}
	all := latencyChart("hot", []result{{library: "limit", shape: hot}, {library: "redisync", shape: hot}})
	some := scaleChart([]libSeries{{library: "redisync", results: []result{{shape: shape{goroutines: 32}, cmds: 2}}}},
		"t", "y", true, func(r result) float64 { return r.cmds })
	if all.series[1].colour == "" || all.series[1].colour != some.series[0].colour {
		t.Errorf("redisync drawn in %q next to the limit, %q without it; want one colour",
			all.series[1].colour, some.series[0].colour)
	}
	if libraryColour("limit") == libraryColour("redisync") {
		t.Error("limit and redisync share a colour")
	}
}
