package main

// The charts are drawn here rather than with a plotting library. A
// version on gonum.org/v1/plot v0.17.0 drawing the same charts came to
// about 160 lines against this file's 250, before mending what it drew
// worse: a legend inside the data area, over the curves (keeping it out
// takes a cropped canvas and a second legend), and text set in Liberation
// Serif and placed with that font's metrics, so that a viewer without the
// font (GitHub's) misaligns the labels unless the fonts are embedded in
// every SVG. It also took bench from 39 to 69 modules and its binary from
// 13 to 20 MB (fonts, LaTeX, PDF and raster back-ends). These few
// elements, in the generic sans-serif font, render alike everywhere.

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strings"
)

// Chart geometry, in SVG user units (pixels).
const (
	chartWidth   = 800
	chartHeight  = 460
	marginLeft   = 72
	marginRight  = 200 // the legend's column
	marginTop    = 44
	marginBottom = 58
)

// markersUpTo is the most points a series may have to get a dot on each.
const markersUpTo = 12

// palette colours the series in order (Okabe-Ito, readable by the
// colour-blind), then repeats.
var palette = []string{"#000000", "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#f0e442"}

// An axis maps data values to one side of the plot.
type axis struct {
	label  string
	log    bool                 // logarithmic; values <= 0 are not drawn
	ticks  []float64            // where to mark it; nil: chosen from the data
	format func(float64) string // a tick's label
	lo, hi float64              // the range shown; set by fit
}

// A series is one line of a chart.
type series struct {
	name   string
	colour string    // "": the palette's, by the series' place in the chart
	x, y   []float64 // NaN, or <= 0 on a log axis, leaves a gap
}

// A lineChart is a titled set of series over two axes.
type lineChart struct {
	title  string
	x, y   axis
	series []series
}

// svg renders the chart as a standalone SVG document.
func (c lineChart) svg() []byte {
	var xs, ys []float64
	for _, s := range c.series {
		for i := range s.x {
			if c.x.drawable(s.x[i]) && c.y.drawable(s.y[i]) {
				xs, ys = append(xs, s.x[i]), append(ys, s.y[i])
			}
		}
	}
	c.x.fit(xs)
	c.y.fit(ys)
	w := newSVG(chartWidth, chartHeight)
	plotW := float64(chartWidth - marginLeft - marginRight)
	plotH := float64(chartHeight - marginTop - marginBottom)
	px := func(v float64) float64 { return marginLeft + c.x.position(v)*plotW }
	py := func(v float64) float64 { return marginTop + (1-c.y.position(v))*plotH }

	w.text(chartWidth/2, 24, "middle", "font-size=\"16\" font-weight=\"bold\"", c.title)
	for _, t := range c.x.ticks {
		x := px(t)
		w.line(x, marginTop, x, marginTop+plotH, "#dddddd")
		w.text(x, marginTop+plotH+18, "middle", "", c.x.format(t))
	}
	for _, t := range c.y.ticks {
		y := py(t)
		w.line(marginLeft, y, marginLeft+plotW, y, "#dddddd")
		w.text(marginLeft-6, y+4, "end", "", c.y.format(t))
	}
	w.rect(marginLeft, marginTop, plotW, plotH, "#444444")
	w.text(marginLeft+plotW/2, chartHeight-14, "middle", "", c.x.label)
	w.text(16, marginTop+plotH/2, "middle", fmt.Sprintf("transform=\"rotate(-90 16 %.1f)\"", marginTop+plotH/2), c.y.label)

	for i, s := range c.series {
		colour := s.colour
		if colour == "" {
			colour = palette[i%len(palette)]
		}
		var run [][2]float64
		flush := func() {
			w.polyline(run, colour)
			run = run[:0]
		}
		for j := range s.x {
			if !c.x.drawable(s.x[j]) || !c.y.drawable(s.y[j]) {
				flush()
				continue
			}
			run = append(run, [2]float64{px(s.x[j]), py(s.y[j])})
		}
		flush()
		if len(s.x) <= markersUpTo {
			for j := range s.x {
				if c.x.drawable(s.x[j]) && c.y.drawable(s.y[j]) {
					w.dot(px(s.x[j]), py(s.y[j]), colour)
				}
			}
		}
		ly := float64(marginTop + 8 + 22*i)
		lx := float64(chartWidth - marginRight + 16)
		w.line(lx, ly, lx+24, ly, colour)
		w.text(lx+30, ly+4, "start", "", s.name)
	}
	return w.close()
}

// drawable reports whether v can be placed on a.
func (a axis) drawable(v float64) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!a.log || v > 0)
}

// fit sets the axis range to cover values and its ticks, and chooses
// ticks if none were given.
func (a *axis) fit(values []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range append(values, a.ticks...) {
		lo, hi = min(lo, v), max(hi, v)
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	switch {
	case a.log && a.ticks != nil:
		lo, hi = lo/1.25, hi*1.25
	case a.log:
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
		if lo == hi {
			hi = lo * 10
		}
		a.ticks = logTicks(lo, hi)
	default:
		lo = min(lo, 0)
		if hi <= lo {
			hi = lo + 1
		}
		step := niceStep((hi - lo) / 5)
		hi = math.Ceil(hi/step) * step
		if a.ticks == nil {
			for t := lo; t <= hi+step/2; t += step {
				a.ticks = append(a.ticks, t)
			}
		}
	}
	a.lo, a.hi = lo, hi
}

// position maps v to 0..1 along the axis.
func (a axis) position(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// logTicks returns the powers of ten from lo to hi, with 2 and 5 times
// each when that makes no more than a dozen ticks.
func logTicks(lo, hi float64) []float64 {
	var decades, all []float64
	for t := lo; t <= hi*1.0001; t *= 10 {
		decades = append(decades, t)
		for _, m := range []float64{1, 2, 5} {
			if t*m <= hi*1.0001 {
				all = append(all, t*m)
			}
		}
	}
	if len(all) <= 12 {
		return all
	}
	return decades
}

// niceStep rounds a step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// svgWriter writes the few SVG elements the charts need.
type svgWriter struct{ b bytes.Buffer }

// newSVG starts a document of the given size with a white background.
func newSVG(width, height int) *svgWriter {
	w := &svgWriter{}
	fmt.Fprintf(&w.b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"+
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"+
		"<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", width, height, width, height)
	return w
}

// line draws a straight line.
func (w *svgWriter) line(x1, y1, x2, y2 float64, colour string) {
	fmt.Fprintf(&w.b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>\n", x1, y1, x2, y2, colour)
}

// rect draws an unfilled rectangle.
func (w *svgWriter) rect(x, y, width, height float64, colour string) {
	fmt.Fprintf(&w.b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"%s\"/>\n", x, y, width, height, colour)
}

// dot draws a small filled circle.
func (w *svgWriter) dot(x, y float64, colour string) {
	fmt.Fprintf(&w.b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y, colour)
}

// polyline joins points, or draws a dot for a single one.
func (w *svgWriter) polyline(points [][2]float64, colour string) {
	switch len(points) {
	case 0:
		return
	case 1:
		w.dot(points[0][0], points[0][1], colour)
		return
	}
	var sb strings.Builder
	for i, p := range points {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%.1f,%.1f", p[0], p[1])
	}
	fmt.Fprintf(&w.b, "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-linejoin=\"round\"/>\n", sb.String(), colour)
}

// text writes escaped text anchored at (x, y); attrs are extra attributes
// written as they are.
func (w *svgWriter) text(x, y float64, anchor, attrs, s string) {
	fmt.Fprintf(&w.b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" %s>", x, y, anchor, attrs)
	_ = xml.EscapeText(&w.b, []byte(s)) // a bytes.Buffer does not fail
	w.b.WriteString("</text>\n")
}

// close ends the document and returns it.
func (w *svgWriter) close() []byte {
	w.b.WriteString("</svg>\n")
	return w.b.Bytes()
}
