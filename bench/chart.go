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

// chartLine is one series: a workload's added p50 or p99 for Sandgate, or for the workload's
// floor (relay, goproxy) beside it. Points holds only measured cells: a sandbox count with no
// point is a gap in the line, never a zero.
type chartLine struct {
	name   string
	floor  bool // the floor's line, drawn thin and dashed in its workload's colour
	color  int  // palette index, shared by a workload's Sandgate and floor lines
	points []chartPoint
}

// writeChart plots added latency (p50 and p99 over direct, fixed rate) against the number of
// sandboxes: for each swept workload Sandgate's lines and, beside them, its floor's, on a
// log-scaled sandbox axis.
func writeChart(path string, r *Report) error {
	lines, ns := chartLines(r)
	const W, H, left, right, top, bottom = 960, 540, 80, 260, 50, 60
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	c := canvas{img}
	c.rect(0, 0, W, H, color.White)
	black := color.RGBA{40, 40, 40, 255}
	grey := color.RGBA{220, 220, 220, 255}
	c.text(left, 16, 3, "ADDED LATENCY VS SANDBOXES (FIXED RATE, MS)", black)
	if len(ns) == 0 {
		c.text(left, H/2, 3, "NO MEASURED FIXED-RATE DATA", black)
		return savePNG(path, img)
	}
	ymin, ymax := chartRange(lines)
	lx0, lx1 := math.Log10(ns[0]), math.Log10(ns[len(ns)-1])
	if lx1-lx0 < 1e-9 {
		lx0, lx1 = lx0-0.5, lx1+0.5
	}
	px := func(n float64) int {
		return left + int((math.Log10(n)-lx0)/(lx1-lx0)*float64(W-left-right-40)) + 20
	}
	py := func(v float64) int { return H - bottom - int((v-ymin)/(ymax-ymin)*float64(H-top-bottom)) }
	for i := 0; i <= 5; i++ {
		v := ymin + (ymax-ymin)*float64(i)/5
		y := py(v)
		c.rect(left, y, W-right, y+1, grey)
		lbl := fmt.Sprintf("%.2f", v)
		c.text(left-8-textWidth(lbl, 2), y-5, 2, lbl, black)
	}
	for _, n := range ns {
		x := px(n)
		c.rect(x, top, x+1, H-bottom, grey)
		lbl := fmt.Sprint(int(n))
		c.text(x-textWidth(lbl, 2)/2, H-bottom+10, 2, lbl, black)
	}
	c.text(left+(W-left-right)/2-textWidth("SANDBOXES", 2)/2, H-bottom+34, 2, "SANDBOXES", black)
	c.rect(left, top, left+2, H-bottom, black)
	c.rect(left, H-bottom, W-right, H-bottom+2, black)
	for i, l := range lines {
		col := chartPalette[l.color%len(chartPalette)]
		drawLine(c, l, ns, px, py, col)
		ly := top + 10 + i*20
		if l.floor {
			for x := W - right + 20; x < W-right+44; x += 6 {
				c.rect(x, ly+4, x+3, ly+6, col)
			}
		} else {
			c.rect(W-right+20, ly, W-right+44, ly+10, col)
		}
		c.text(W-right+52, ly, 2, l.name, black)
	}
	return savePNG(path, img)
}

var chartPalette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}}

// drawLine draws l's points and joins two of them only when they are neighbours on the sandbox
// axis: a count l has no point at breaks the line. A floor's line is thin and dashed, its
// points hollow.
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
		if l.floor {
			c.rect(x-4, y-4, x+4, y+4, col)
			c.rect(x-2, y-2, x+2, y+2, color.White)
		} else {
			c.rect(x-4, y-4, x+4, y+4, col)
		}
		prev, ok := at[ns[max(j-1, 0)]]
		if j == 0 || !ok {
			continue
		}
		x0, y0 := px(ns[j-1]), py(prev)
		if !l.floor {
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

// chartFloor is the floor a workload's latency target reads (ratioSpecs): relay or goproxy.
func chartFloor(w string) string {
	for _, sp := range ratioSpecs {
		if sp.workload == w && sp.target == "" {
			if shape, _ := sp.cell(0, 0); shape == ShapeRate {
				return sp.floor
			}
		}
	}
	return ""
}

// measured reports a fixed-rate row that completed requests: a cell whose sandboxes all failed
// has no latency, and its zeros are no measurement.
func measured(row Row) bool { return row.Requests > row.Errors && row.P50MS > 0 }

// chartLines is Sandgate's added p50 and p99 of each swept workload by sandbox count, each
// followed by its floor's, with only measured points; and the sorted distinct counts at which
// anything was measured.
func chartLines(r *Report) ([]chartLine, []float64) {
	direct := map[Cell]Row{}
	for _, row := range r.Rows {
		if row.Target == "direct" {
			direct[row.Cell] = row
		}
	}
	var lines []chartLine
	var ns []float64
	for wi, w := range sweepWorkloads {
		for qi, q := range []string{"P50", "P99"} {
			for _, target := range []string{"sandgate", chartFloor(w)} {
				l := chartLine{name: strings.ToUpper(w) + " " + q, floor: target != "sandgate", color: 2*wi + qi}
				if l.floor {
					l.name += " " + strings.ToUpper(target)
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
					v := row.P50MS - d.P50MS
					if q == "P99" {
						v = row.P99MS - d.P99MS
					}
					l.points = append(l.points, chartPoint{float64(row.Sandboxes), v})
					ns = append(ns, float64(row.Sandboxes))
				}
				if target != "" && len(l.points) > 0 {
					slices.SortFunc(l.points, func(a, b chartPoint) int { return int(a.n - b.n) })
					lines = append(lines, l)
				}
			}
		}
	}
	slices.Sort(ns)
	return lines, slices.Compact(ns)
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
