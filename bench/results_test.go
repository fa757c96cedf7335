package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallRun is a report of one repetition of the route workload against relay and a baseline.
func smallRun() *Report {
	o := Options{Sandboxes: 100, Sweep: []int{100}, Concurrency: []int{64}, Reps: 1, Rate: 500}
	var results []Result
	for i, target := range []string{"direct", "sandgate", "relay", "baseline"} {
		f := float64(i + 1)
		results = append(results,
			Result{Cell: Cell{Workload: WRoute, Target: target, Shape: ShapeClosed, Sandboxes: 100, Concurrency: 64},
				Requests: 1000, Throughput: 1000 / f, P50MS: f, P99MS: 2 * f, CPUPerReqUS: 100 * f},
			Result{Cell: Cell{Workload: WRoute, Target: target, Shape: ShapeRate, Sandboxes: 100, Rate: 500},
				Requests: 500, Throughput: 500, P50MS: f, P99MS: 2 * f, RSSBytes: int64(i+1) << 20})
	}
	return buildReport(o, results, nil)
}

func fileNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// A run writes its report and nothing else: no index, no latest.json (those are the kept
// reports', rewritten only with -publish), so a run into the default var/bench changes no
// tracked file.
func TestARunWritesOnlyItsReportUnlessPublished(t *testing.T) {
	dir, raw := t.TempDir(), t.TempDir()
	require.NoError(t, smallRun().Write(dir, raw, "2026-12-01-abc", false))
	assert.ElementsMatch(t, []string{"2026-12-01-abc.md", "2026-12-01-abc.json", "2026-12-01-abc-charts.png"}, fileNames(t, dir))
	assert.Equal(t, "var/bench", OutDir, "the default out folder is one git ignores")
	assert.True(t, strings.HasPrefix(RawDir, OutDir+"/"))
}

// TestWriteKeepsTheRawDumpOutOfResults publishes a report: the results folder gets the
// Markdown, the chart and the ratio JSON (also as latest.json), one ratio per line, and the
// index; the dump of every cell goes to the raw folder, and reading it back gives the same
// ratio JSON.
func TestWriteKeepsTheRawDumpOutOfResults(t *testing.T) {
	dir, raw := t.TempDir(), t.TempDir()
	r := smallRun()
	require.NoError(t, r.Write(dir, raw, "2026-12-01-abc", true))
	assert.ElementsMatch(t, []string{"2026-12-01-abc.md", "2026-12-01-abc.json", "2026-12-01-abc-charts.png", "latest.json", "README.md"}, fileNames(t, dir))

	ratios, err := os.ReadFile(filepath.Join(dir, "2026-12-01-abc.json"))
	require.NoError(t, err)
	var got struct {
		Label  string  `json:"label"`
		Ratios []Ratio `json:"ratios"`
		AB     []Ratio `json:"ab"`
		Checks []Check `json:"checks"`
	}
	require.NoError(t, json.Unmarshal(ratios, &got))
	assert.Equal(t, "2026-12-01-abc", got.Label)
	require.NotEmpty(t, got.Ratios)
	assert.True(t, slices.ContainsFunc(got.Ratios, func(x Ratio) bool { return x.Workload == WRoute && x.Measured && x.Floor == "relay" }))
	require.NotEmpty(t, got.AB, "the A/B against the baseline binary")
	assert.NotContains(t, string(ratios), `"results"`, "no cell dump in the results folder")
	assert.Less(t, strings.Count(string(ratios), "\n"), len(got.Ratios)+len(got.AB)+len(got.Checks)+14, "one line per ratio")
	latest, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	require.NoError(t, err)
	assert.Equal(t, ratios, latest)

	back, err := ReadRaw(filepath.Join(raw, "2026-12-01-abc.json"))
	require.NoError(t, err)
	assert.Len(t, back.Results, len(r.Results), "the raw dump has every cell")
	again, err := back.RatioJSON("2026-12-01-abc")
	require.NoError(t, err)
	assert.JSONEq(t, string(ratios), string(again), "a dump read back gives the same ratios")
}
