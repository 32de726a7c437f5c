package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"gcompile/passes/schedule"
)

// writeTimeline draws the simulated schedule to path as an SVG file.
func writeTimeline(path string, s *schedule.Schedule, res *schedule.Result, cost schedule.Cost) error {
	return os.WriteFile(path, []byte(timelineSVG(s, res, cost)), 0o644)
}

// timelineKinds are the actions a timeline draws (sends and receives take
// no time in the simulation), with their colours and legend names.
var timelineKinds = []struct {
	kind        schedule.Kind
	color, name string
}{
	{schedule.F, "#8ab4f8", "forward (F)"},
	{schedule.B, "#81c995", "backward (B)"},
	{schedule.W, "#fdd663", "weight gradient (W)"},
}

// Timeline geometry, in SVG pixels. The time scale aims at a drawing about
// timelineTargetW wide, within bounds that keep a unit-cost forward box wide
// enough to tell apart and a short schedule from being blown up.
const (
	timelineTargetW                    = 1000.0
	timelineMinUnit, timelineMaxUnit   = 8.0, 48.0
	timelineLeft, timelineRight        = 86.0, 28.0
	timelineTitleY, timelineLegendY    = 20.0, 44.0
	timelineRow, timelineRowsMinH      = 28.0, 84.0 // a row's least height; all rows' least, for the rank axis's label
	timelineAxisH, timelineMinW        = 52.0, 640.0
	timelineFont                       = `font-family="sans-serif" font-size="12"`
	timelineCharW, timelineLabelCharW  = 7.0, 6.7 // upper bounds of a glyph's width at 12px sans, 11px mono
	timelineIdle, timelineLegendSwatch = "#eeeeee", 14.0
)

// timelineSVG draws the simulated schedule: one row per pipeline rank, one
// box per action coloured by kind and labelled chunk·kind·microbatch (0F3
// is chunk 0's forward of microbatch 3) where the box is wide enough (the
// label is always on hover), over a time axis in the cost's units, with a
// legend of the kinds. The grey behind the boxes is time a rank waits: the
// bubble. --report embeds the same drawing in its page.
func timelineSVG(s *schedule.Schedule, res *schedule.Result, cost schedule.Cost) string {
	if cost == nil {
		cost = schedule.UnitCost
	}
	ticks, _, span := niceTicks(0, res.StepTime, 10, false)
	if span <= 0 {
		span = 1
	}
	unit := min(max(timelineTargetW/span, timelineMinUnit), timelineMaxUnit)
	plotW := span * unit

	// The kinds this schedule has, for the legend and the axis's units.
	present := map[schedule.Kind]schedule.Action{}
	for _, acts := range s.Actions {
		for _, a := range acts {
			if _, ok := present[a.Kind]; !ok {
				present[a.Kind] = a
			}
		}
	}
	var legend []legendItem
	var units []string
	for _, k := range timelineKinds {
		a, ok := present[k.kind]
		if !ok {
			continue
		}
		name := k.name
		if _, split := present[schedule.W]; split && k.kind == schedule.B {
			name = "backward, input gradient (B)"
		}
		legend = append(legend, legendItem{name: name, color: k.color})
		units = append(units, fmt.Sprintf("%s = %s", k.kind, strconv.FormatFloat(cost(a), 'g', 4, 64)))
	}
	legend = append(legend, legendItem{name: "idle: the bubble", color: timelineIdle})

	width := max(timelineLeft+plotW+timelineRight, timelineMinW)
	pos, legendRows := layoutLegend(legend, timelineLeft, width-timelineRight, timelineLegendSwatch+6, timelineCharW)
	top := timelineLegendY + 18*float64(legendRows-1) + 16
	row := max(timelineRow, timelineRowsMinH/float64(max(len(s.Actions), 1)))
	box := row - 6
	rowsH := row * float64(len(s.Actions))
	height := top + rowsH + timelineAxisH
	px := func(t float64) float64 { return timelineLeft + t*unit }

	var b strings.Builder
	// Its natural size, shrunk to the width of a narrower window (or page)
	// rather than scrolled, keeping its proportions.
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart timeline" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" style="max-width:100%%;height:auto" role="img" %s>`+"\n",
		width, height, width, height, timelineFont)
	title := fmt.Sprintf("%s: p=%d v=%d m=%d, simulated bubble %.3f", s.Name, s.Ranks, s.Chunks, s.Micro, res.Bubble)
	fmt.Fprintf(&b, `<title>%s</title>`+"\n", esc("pipeline schedule "+title))
	// Opened on its own, an SVG has no page behind it: some viewers show
	// a transparent one as black.
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="4" y="%.0f" font-size="14" font-weight="bold">%s</text>`+"\n", timelineTitleY, esc(title))
	for i, it := range legend {
		x, y := pos[i][0], timelineLegendY+18*pos[i][1]
		fmt.Fprintf(&b, `<rect class="legend" x="%.1f" y="%.1f" width="%.0f" height="%.0f" fill="%s" stroke="#333333" stroke-width="0.5"/>`, x, y-11, timelineLegendSwatch, timelineLegendSwatch, it.color)
		fmt.Fprintf(&b, `<text class="legend" x="%.1f" y="%.1f">%s</text>`+"\n", x+timelineLegendSwatch+5, y+1, esc(it.name))
	}

	// Idle background per rank, then the grid, then the actions on top.
	for r := range s.Actions {
		y := top + row*float64(r)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", timelineLeft, y, px(res.StepTime)-timelineLeft, box, timelineIdle)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">rank %d</text>`+"\n", timelineLeft-8, y+box/2+4, r)
	}
	axisY := top + rowsH
	digits := tickDigits(ticks)
	for _, t := range ticks {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#d0d0d0"/>`, px(t), top-4, px(t), axisY)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#444444"/>`, px(t), axisY, px(t), axisY+5)
		fmt.Fprintf(&b, `<text class="tick" data-axis="x" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(t), axisY+18, strconv.FormatFloat(t, 'f', digits, 64))
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#444444"/>`+"\n", timelineLeft, axisY, px(span), axisY)
	fmt.Fprintf(&b, `<text class="axis-label" data-axis="x" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
		timelineLeft+plotW/2, height-8, esc("simulated time (cost units: "+strings.Join(units, ", ")+")"))
	fmt.Fprintf(&b, `<text class="axis-label" data-axis="y" transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">pipeline rank</text>`+"\n", top+rowsH/2)

	colors := map[schedule.Kind]string{}
	for _, k := range timelineKinds {
		colors[k.kind] = k.color
	}
	for r, acts := range s.Actions {
		y := top + row*float64(r)
		for i, a := range acts {
			col, ok := colors[a.Kind]
			if !ok {
				continue
			}
			start, d := res.Start[r][i], cost(a)
			x, w := px(start), d*unit
			label := a.String()
			fmt.Fprintf(&b, `<rect data-kind="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="#333333" stroke-width="0.5"><title>%s</title></rect>`,
				a.Kind, x, y, w, box, col, esc(fmt.Sprintf("rank %d: %s from %g to %g", r, label, start, start+d)))
			if w >= timelineLabelCharW*float64(len(label))+4 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-family="monospace" font-size="11" text-anchor="middle" pointer-events="none">%s</text>`, x+w/2, y+box/2+4, esc(label))
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// legendItem is one entry of a chart's legend: a swatch and a name.
type legendItem struct {
	name, color string
	dashed      bool
}

// layoutLegend places legend entries left to right from x0, starting a new
// row where the next would pass maxX; pos holds each entry's x and row. A
// legend on one line that runs off the drawing is cut by the SVG's edge.
func layoutLegend(items []legendItem, x0, maxX, swatchW, charW float64) (pos [][2]float64, rows int) {
	x, row := x0, 0.0
	for _, it := range items {
		w := swatchW + charW*float64(len([]rune(it.name))) + 16
		if x > x0 && x+w > maxX {
			x, row = x0, row+1
		}
		pos = append(pos, [2]float64{x, row})
		x += w
	}
	return pos, int(row) + 1
}
