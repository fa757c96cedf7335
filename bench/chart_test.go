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

// TestChartLeavesAMissingPointOut draws a run whose 10,000-sandbox intercept cell measured
// nothing (every sandbox failed, so its percentiles are zeros): that count is a gap in the
// intercept lines, not 0 ms, while route keeps its point there; each workload's floor has a
// line of its own beside Sandgate's.
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
	lines, ns := chartLines(r)
	assert.Equal(t, []float64{100, 1000, 10000}, ns)
	byName := map[string]chartLine{}
	for _, l := range lines {
		byName[l.name] = l
	}
	require.Contains(t, byName, "INTERCEPT P99")
	assert.Equal(t, []chartPoint{{100, 3}, {1000, 3}}, byName["INTERCEPT P99"].points, "the failed cell is no point at all")
	assert.Equal(t, []chartPoint{{100, 0.5}, {1000, 0.5}, {10000, 0.5}}, byName["ROUTE P50"].points)
	floor := byName["INTERCEPT P99 GOPROXY"]
	assert.True(t, floor.floor)
	assert.Len(t, floor.points, 3, "the floor measured every count")
	assert.Equal(t, byName["INTERCEPT P99"].color, floor.color, "a floor shares its workload's colour")
	assert.Contains(t, byName, "ROUTE P99 RELAY")
	assert.NotContains(t, byName, "MCP P50", "a workload that was not run has no line")

	path := filepath.Join(t.TempDir(), "chart.png")
	require.NoError(t, writeChart(path, r))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	_, err = png.Decode(f)
	assert.NoError(t, err)
}

// TestChartKeepsANegativePoint keeps a measured point below zero (Sandgate faster than direct
// at that percentile) as measured, on an axis that reaches below zero.
func TestChartKeepsANegativePoint(t *testing.T) {
	r := &Report{Rows: []Row{rateRow(WMCP, "direct", 100, 500, 1.0, 3.0), rateRow(WMCP, "sandgate", 100, 500, 1.2, 2.5)}}
	lines, _ := chartLines(r)
	require.NotEmpty(t, lines)
	ymin, ymax := chartRange(lines)
	assert.Less(t, ymin, -0.4)
	assert.GreaterOrEqual(t, ymax, 0.2)
}
