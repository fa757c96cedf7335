package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"slices"
	"strings"
)

// glyphs is a 3×5 bitmap font: enough for axis labels and the legend (upper case).
var glyphs = map[rune]string{
	'0': "111101101101111", '1': "010110010010111", '2': "111001111100111", '3': "111001111001111",
	'4': "101101111001001", '5': "111100111001111", '6': "111100111101111", '7': "111001001001001",
	'8': "111101111101111", '9': "111101111001111", 'A': "010101111101101", 'B': "110101110101110",
	'C': "011100100100011", 'D': "110101101101110", 'E': "111100110100111", 'F': "111100110100100",
	'G': "011100101101011", 'H': "101101111101101", 'I': "111010010010111", 'J': "001001001101010",
	'K': "101101110101101", 'L': "100100100100111", 'M': "101111111101101", 'N': "110101101101101",
	'O': "010101101101010", 'P': "110101110100100", 'Q': "010101101110011", 'R': "110101110101101",
	'S': "011100010001110", 'T': "111010010010010", 'U': "101101101101111", 'V': "101101101101010",
	'W': "101101111111101", 'X': "101101010101101", 'Y': "101101010010010", 'Z': "111001010100111",
	'.': "000000000000010", '-': "000000111000000", '/': "001001010100100", '(': "010100100100010",
	')': "010001001001010", '=': "000111000111000", ',': "000000000010100", ':': "000010000010000",
}

// canvas draws on an RGBA image.
type canvas struct{ img *image.RGBA }

func (c canvas) rect(x0, y0, x1, y1 int, col color.Color) {
	for y := y0; y < y1; y++ {
		for x := x0; x < x1; x++ {
			c.img.Set(x, y, col)
		}
	}
}

// line draws a thick line (Bresenham with a square pen).
func (c canvas) line(x0, y0, x1, y1, w int, col color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	err := dx + dy
	for {
		c.rect(x0-w/2, y0-w/2, x0-w/2+w, y0-w/2+w, col)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

// text writes s at (x, y) (top left) with pixel scale k.
func (c canvas) text(x, y, k int, s string, col color.Color) {
	for _, r := range strings.ToUpper(s) {
		if g, ok := glyphs[r]; ok {
			for i, b := range g {
				if b == '1' {
					c.rect(x+(i%3)*k, y+(i/3)*k, x+(i%3+1)*k, y+(i/3+1)*k, col)
				}
			}
		}
		x += 4 * k
	}
}

func textWidth(s string, k int) int { return len(s) * 4 * k }

func abs(v int) int { return max(v, -v) }
func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// chartPoint is one measured point of a chart series: sandboxes and added milliseconds.
type chartPoint struct{ n, v float64 }

// chartLine is one series of a workload's chart: one target's added p99 (drawn solid) or p50
// (thin, dashed) over direct, at each sandbox count. Points holds only measured cells: a sandbox
// count with no point is a gap in the line, never a zero.
type chartLine struct {
	name   string
	target string
	p50    bool
	color  int // palette index: one per target, shared by its p50 and p99
	points []chartPoint
}

// chartPanel is one workload's chart.
type chartPanel struct {
	workload string
	lines    []chartLine
	ns       []float64 // the sandbox counts anything was measured at, ascending
}

// Chart geometry: panels of panelW × panelH, chartColumns to a row.
const (
	panelW, panelH, chartColumns                 = 720, 420, 2
	panelLeft, panelRight, panelTop, panelBottom = 70, 190, 44, 56
)

// writeChart draws one chart per workload, as panels of one image: added latency (p99 solid,
// p50 dashed, over direct, at the fixed rate) against the number of sandboxes, for Sandgate,
// the workload's floor and every peer that serves it, on a log-scaled sandbox axis.
func writeChart(path string, r *Report) error {
	panels := chartPanels(r)
	rows := max(1, (len(panels)+chartColumns-1)/chartColumns)
	img := image.NewRGBA(image.Rect(0, 0, panelW*chartColumns, panelH*rows))
	c := canvas{img}
	c.rect(0, 0, panelW*chartColumns, panelH*rows, color.White)
	if len(panels) == 0 {
		c.text(panelLeft, panelH/2, 3, "NO MEASURED FIXED-RATE DATA", color.RGBA{40, 40, 40, 255})
		return savePNG(path, img)
	}
	for i, p := range panels {
		drawPanel(c, (i%chartColumns)*panelW, (i/chartColumns)*panelH, p)
	}
	return savePNG(path, img)
}

// drawPanel draws p with its top left corner at (x0, y0).
func drawPanel(c canvas, x0, y0 int, p chartPanel) {
	black := color.RGBA{40, 40, 40, 255}
	grey := color.RGBA{220, 220, 220, 255}
	c.text(x0+panelLeft, y0+14, 2, p.workload+": ADDED MS OVER DIRECT (P99 SOLID, P50 DASHED)", black)
	ymin, ymax := chartRange(p.lines)
	lx0, lx1 := math.Log10(p.ns[0]), math.Log10(p.ns[len(p.ns)-1])
	if lx1-lx0 < 1e-9 {
		lx0, lx1 = lx0-0.5, lx1+0.5
	}
	px := func(n float64) int {
		return x0 + panelLeft + 20 + int((math.Log10(n)-lx0)/(lx1-lx0)*float64(panelW-panelLeft-panelRight-40))
	}
	py := func(v float64) int {
		return y0 + panelH - panelBottom - int((v-ymin)/(ymax-ymin)*float64(panelH-panelTop-panelBottom))
	}
	for i := 0; i <= 5; i++ {
		v := ymin + (ymax-ymin)*float64(i)/5
		y := py(v)
		c.rect(x0+panelLeft, y, x0+panelW-panelRight, y+1, grey)
		lbl := fmt.Sprintf("%.2f", v)
		c.text(x0+panelLeft-8-textWidth(lbl, 2), y-5, 2, lbl, black)
	}
	for _, n := range p.ns {
		x := px(n)
		c.rect(x, y0+panelTop, x+1, y0+panelH-panelBottom, grey)
		lbl := fmt.Sprint(int(n))
		c.text(x-textWidth(lbl, 2)/2, y0+panelH-panelBottom+10, 2, lbl, black)
	}
	mid := x0 + panelLeft + (panelW-panelLeft-panelRight)/2
	c.text(mid-textWidth("SANDBOXES", 2)/2, y0+panelH-panelBottom+32, 2, "SANDBOXES", black)
	c.rect(x0+panelLeft, y0+panelTop, x0+panelLeft+2, y0+panelH-panelBottom, black)
	c.rect(x0+panelLeft, y0+panelH-panelBottom, x0+panelW-panelRight, y0+panelH-panelBottom+2, black)
	legend := 0
	for _, l := range p.lines {
		col := chartPalette[l.color%len(chartPalette)]
		drawLine(c, l, p.ns, px, py, col)
		if l.p50 {
			continue
		}
		ly := y0 + panelTop + 10 + legend*20
		legend++
		c.rect(x0+panelW-panelRight+16, ly, x0+panelW-panelRight+40, ly+10, col)
		c.text(x0+panelW-panelRight+48, ly, 2, l.name, black)
	}
}

var chartPalette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}}

// drawLine draws l's points and joins two of them only when they are neighbours on the sandbox
// axis: a count l has no point at breaks the line. A p50 line is thin and dashed, its points
// hollow.
func drawLine(c canvas, l chartLine, ns []float64, px func(float64) int, py func(float64) int, col color.RGBA) {
	at := map[float64]float64{}
	for _, p := range l.points {
		at[p.n] = p.v
	}
	for j, n := range ns {
		v, ok := at[n]
		if !ok {
			continue
		}
		x, y := px(n), py(v)
		c.rect(x-4, y-4, x+4, y+4, col)
		if l.p50 {
			c.rect(x-2, y-2, x+2, y+2, color.White)
		}
		prev, ok := at[ns[max(j-1, 0)]]
		if j == 0 || !ok {
			continue
		}
		x0, y0 := px(ns[j-1]), py(prev)
		if !l.p50 {
			c.line(x0, y0, x, y, 3, col)
			continue
		}
		const dashes = 12
		for k := 0; k < dashes; k += 2 {
			c.line(x0+(x-x0)*k/dashes, y0+(y-y0)*k/dashes, x0+(x-x0)*(k+1)/dashes, y0+(y-y0)*(k+1)/dashes, 1, col)
		}
	}
}

// chartRange is the y axis: from 0 (or below, when a measured point is negative: the target
// answered faster than direct at that percentile) to a round value above the highest point.
func chartRange(lines []chartLine) (ymin, ymax float64) {
	for _, l := range lines {
		for _, p := range l.points {
			ymin, ymax = math.Min(ymin, p.v), math.Max(ymax, p.v)
		}
	}
	if ymin < 0 {
		ymin = -niceCeil(-ymin)
	}
	return ymin, niceCeil(ymax)
}

// floorOf is the floor a workload's targets are judged against (ratioSpecs): relay or goproxy;
// "" for a workload without one (mix).
func floorOf(w string) string {
	for _, sp := range ratioSpecs {
		if sp.workload == w && sp.target == "" {
			return sp.floor
		}
	}
	return ""
}

// peerNames are the other proxies the bench measures (bench/README.md).
var peerNames = []string{"squid", "tinyproxy", "smokescreen"}

// chartTargets are the targets of workload w's chart: Sandgate, its floor, and every peer that
// serves w.
func chartTargets(w string) []string {
	out := []string{"sandgate"}
	if f := floorOf(w); f != "" {
		out = append(out, f)
	}
	for _, p := range peerNames {
		if supports(p, w) {
			out = append(out, p)
		}
	}
	return out
}

// measured reports a fixed-rate row that completed requests: a cell whose sandboxes all failed
// has no latency, and its zeros are no measurement.
func measured(row Row) bool { return row.Requests > row.Errors && row.P50MS > 0 }

// chartPanels is one panel per workload in which Sandgate measured a fixed-rate cell against
// direct, in report order.
func chartPanels(r *Report) []chartPanel {
	var panels []chartPanel
	for _, w := range AllWorkloads {
		if p := chartPanelOf(r, w); len(p.lines) > 0 && slices.ContainsFunc(p.lines, func(l chartLine) bool { return l.target == "sandgate" }) {
			panels = append(panels, p)
		}
	}
	return panels
}

// chartPanelOf is workload w's chart: each target's added p99 and p50 by sandbox count, with
// only measured points, and the sorted distinct counts at which anything was measured.
func chartPanelOf(r *Report, w string) chartPanel {
	direct := map[Cell]Row{}
	for _, row := range r.Rows {
		if row.Target == "direct" {
			direct[row.Cell] = row
		}
	}
	p := chartPanel{workload: strings.ToUpper(w)}
	for ti, target := range chartTargets(w) {
		for _, p50 := range []bool{false, true} {
			l := chartLine{name: strings.ToUpper(target), target: target, p50: p50, color: ti}
			if target == floorOf(w) {
				l.name += " (FLOOR)"
			}
			for _, row := range r.Rows {
				if row.Target != target || row.Workload != w || row.Shape != ShapeRate {
					continue
				}
				dc := row.Cell
				dc.Target = "direct"
				d, ok := direct[dc]
				if !ok || !measured(row) || !measured(d) {
					continue
				}
				v := row.P99MS - d.P99MS
				if p50 {
					v = row.P50MS - d.P50MS
				}
				l.points = append(l.points, chartPoint{float64(row.Sandboxes), v})
				p.ns = append(p.ns, float64(row.Sandboxes))
			}
			if len(l.points) > 0 {
				slices.SortFunc(l.points, func(a, b chartPoint) int { return int(a.n - b.n) })
				p.lines = append(p.lines, l)
			}
		}
	}
	slices.Sort(p.ns)
	p.ns = slices.Compact(p.ns)
	return p
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 0.1).
func niceCeil(v float64) float64 {
	if v <= 0.1 {
		return 0.1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func savePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("write chart: %w", err)
	}
	return f.Close()
}
