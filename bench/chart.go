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

// writeChart plots Sandgate's added latency (p50 and p99 over direct, fixed rate) against the
// number of sandboxes, one line per workload and percentile, log-scaled sandbox axis.
// chartPoint is one measurement of a chart series: sandboxes and added milliseconds.
type chartPoint struct{ n, v float64 }

func writeChart(path string, r *Report) error {
	series, names, ns := chartSeries(r)
	const W, H, left, right, top, bottom = 960, 540, 80, 220, 50, 60
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	c := canvas{img}
	c.rect(0, 0, W, H, color.White)
	black := color.RGBA{40, 40, 40, 255}
	grey := color.RGBA{220, 220, 220, 255}
	c.text(left, 16, 3, "SANDGATE ADDED LATENCY VS SANDBOXES (FIXED RATE, MS)", black)
	if len(ns) == 0 {
		c.text(left, H/2, 3, "NO FIXED-RATE SANDGATE DATA", black)
		return savePNG(path, img)
	}
	ymax := 0.0
	for _, s := range series {
		for _, p := range s {
			ymax = math.Max(ymax, p.v)
		}
	}
	ymax = niceCeil(ymax)
	lx0, lx1 := math.Log10(ns[0]), math.Log10(ns[len(ns)-1])
	if lx1-lx0 < 1e-9 {
		lx0, lx1 = lx0-0.5, lx1+0.5
	}
	px := func(n float64) int {
		return left + int((math.Log10(n)-lx0)/(lx1-lx0)*float64(W-left-right-40)) + 20
	}
	py := func(v float64) int { return H - bottom - int(v/ymax*float64(H-top-bottom)) }
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
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
	palette := []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {214, 39, 40, 255},
		{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255}}
	for i, name := range names {
		col := palette[i%len(palette)]
		s := series[name]
		for j := range s {
			x, y := px(s[j].n), py(s[j].v)
			c.rect(x-4, y-4, x+4, y+4, col)
			if j > 0 {
				c.line(px(s[j-1].n), py(s[j-1].v), x, y, 3, col)
			}
		}
		ly := top + 10 + i*22
		c.rect(W-right+20, ly, W-right+44, ly+10, col)
		c.text(W-right+52, ly, 2, name, black)
	}
	return savePNG(path, img)
}

// chartSeries is the added p50 and p99 of each swept workload by sandbox count (each series
// sorted by count), the series' names in order, and the sorted distinct counts.
func chartSeries(r *Report) (map[string][]chartPoint, []string, []float64) {
	series := map[string][]chartPoint{}
	var names []string
	var ns []float64
	for _, row := range r.Rows {
		if row.Target != "sandgate" || row.Shape != ShapeRate || !row.HasDirect || !slices.Contains(sweepWorkloads, row.Workload) {
			continue
		}
		for _, p := range []struct {
			q string
			v float64
		}{{"P50", row.AddedP50MS}, {"P99", row.AddedP99MS}} {
			k := row.Workload + " " + p.q
			if _, ok := series[k]; !ok {
				names = append(names, k)
			}
			series[k] = append(series[k], chartPoint{float64(row.Sandboxes), math.Max(p.v, 0)})
		}
		ns = append(ns, float64(row.Sandboxes))
	}
	for _, s := range series {
		slices.SortFunc(s, func(a, b chartPoint) int { return int(a.n - b.n) })
	}
	slices.Sort(ns)
	return series, names, slices.Compact(ns)
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
