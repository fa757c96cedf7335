package bench

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rateRow is a fixed-rate row of target at n sandboxes: requests completed and percentiles.
func rateRow(w, target string, n int, requests int64, p50, p99 float64) Row {
	return Row{Result: Result{Cell: Cell{Workload: w, Target: target, Shape: ShapeRate, Sandboxes: n, Rate: 500},
		Requests: requests, P50MS: p50, P99MS: p99}}
}

// linesByName indexes a panel's lines: "SANDGATE P99", "RELAY (FLOOR) P50", …
func linesByName(p chartPanel) map[string]chartLine {
	out := map[string]chartLine{}
	for _, l := range p.lines {
		q := " P99"
		if l.p50 {
			q = " P50"
		}
		out[l.name+q] = l
	}
	return out
}

// TestChartLeavesAMissingPointOut draws a run whose 10,000-sandbox intercept cell measured
// nothing (every sandbox failed, so its percentiles are zeros): that count is a gap in
// Sandgate's intercept lines, not 0 ms, while its floor keeps its point there; route's chart
// has its own floor beside Sandgate.
func TestChartLeavesAMissingPointOut(t *testing.T) {
	r := &Report{}
	for _, n := range []int{100, 1000, 10000} {
		r.Rows = append(r.Rows,
			rateRow(WRoute, "direct", n, 500, 1.0, 2.0), rateRow(WRoute, "sandgate", n, 500, 1.5, 4.0),
			rateRow(WRoute, "relay", n, 500, 1.2, 3.0),
			rateRow(WIntercept, "direct", n, 500, 1.0, 2.0), rateRow(WIntercept, "goproxy", n, 500, 1.3, 3.5))
		if n < 10000 {
			r.Rows = append(r.Rows, rateRow(WIntercept, "sandgate", n, 500, 1.6, 5.0))
		} else {
			r.Rows = append(r.Rows, Row{Result: Result{Cell: Cell{Workload: WIntercept, Target: "sandgate", Shape: ShapeRate, Sandboxes: n, Rate: 500},
				Requests: 10000, Errors: 10000, FirstError: "dial: too many open files"}})
		}
	}
	panels := chartPanels(r)
	require.Len(t, panels, 2, "one chart per workload run: route and intercept")
	assert.Equal(t, "ROUTE", panels[0].workload)
	route, intercept := linesByName(panels[0]), linesByName(panels[1])
	assert.Equal(t, []float64{100, 1000, 10000}, panels[1].ns)
	assert.Equal(t, []chartPoint{{100, 3}, {1000, 3}}, intercept["SANDGATE P99"].points, "the failed cell is no point at all")
	assert.Equal(t, []chartPoint{{100, 0.5}, {1000, 0.5}, {10000, 0.5}}, route["SANDGATE P50"].points)
	floor := intercept["GOPROXY (FLOOR) P99"]
	assert.Len(t, floor.points, 3, "the floor measured every count")
	assert.NotEqual(t, intercept["SANDGATE P99"].color, floor.color, "each target its own colour")
	assert.Equal(t, floor.color, intercept["GOPROXY (FLOOR) P50"].color, "a target's p50 and p99 share it")
	assert.Contains(t, route, "RELAY (FLOOR) P99")

	path := filepath.Join(t.TempDir(), "chart.png")
	require.NoError(t, writeChart(path, r))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	assert.Equal(t, panelW*chartColumns, img.Bounds().Dx())
}

// Each workload's chart has Sandgate, its floor and every peer the run measured on it, at each
// sandbox count; a workload no Sandgate cell measured has no chart.
func TestChartHasSandgateItsFloorAndEveryPeer(t *testing.T) {
	r := &Report{}
	for _, n := range []int{100, 1000} {
		for i, target := range []string{"direct", "sandgate", "relay", "squid", "tinyproxy", "smokescreen"} {
			r.Rows = append(r.Rows, rateRow(WTunnel, target, n, 500, 1+float64(i)/10, 2+float64(i)/5))
		}
		r.Rows = append(r.Rows, rateRow(WForward, "direct", n, 500, 1, 2), rateRow(WForward, "squid", n, 500, 1.5, 3))
	}
	panels := chartPanels(r)
	require.Len(t, panels, 1, "forward has no Sandgate cell: no chart")
	lines := linesByName(panels[0])
	for _, name := range []string{"SANDGATE", "RELAY (FLOOR)", "SQUID", "TINYPROXY", "SMOKESCREEN"} {
		for _, q := range []string{" P99", " P50"} {
			require.Contains(t, lines, name+q)
			assert.Len(t, lines[name+q].points, 2, "%s%s at each sandbox count", name, q)
		}
	}
}

// TestChartKeepsANegativePoint keeps a measured point below zero (Sandgate faster than direct
// at that percentile) as measured, on an axis that reaches below zero.
func TestChartKeepsANegativePoint(t *testing.T) {
	r := &Report{Rows: []Row{rateRow(WMCP, "direct", 100, 500, 1.0, 3.0), rateRow(WMCP, "sandgate", 100, 500, 1.2, 2.5)}}
	panels := chartPanels(r)
	require.Len(t, panels, 1)
	ymin, ymax := chartRange(panels[0].lines)
	assert.Less(t, ymin, -0.4)
	assert.GreaterOrEqual(t, ymax, 0.2)
}
