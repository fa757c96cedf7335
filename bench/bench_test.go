package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every cell runs once per repetition, in phases of one sandbox count, fewest sandboxes first,
// so no cell is measured with the state of a larger count in the proxy's memory.
func TestPlanPhasesAscending(t *testing.T) {
	o := Options{Sandboxes: 1000, Sweep: []int{100, 1000, 10000}, Concurrency: []int{64, 512}, Rate: 500}
	targets := []*Target{{Name: "direct"}, {Name: "sandgate"}, {Name: "relay"}, {Name: "squid"}}
	phases := planPhases(o, targets)

	var counts []int
	var all []Cell
	for _, cells := range phases {
		require.NotEmpty(t, cells)
		for _, c := range cells {
			assert.Equal(t, cells[0].Sandboxes, c.Sandboxes, "one sandbox count per phase")
		}
		counts = append(counts, cells[0].Sandboxes)
		all = append(all, cells...)
	}
	assert.Equal(t, []int{64, 100, 512, 1000, 10000}, counts)
	assert.ElementsMatch(t, planCells(o, targets), all, "the phases hold exactly the planned cells")

	// Within a phase the targets of one workload and shape stay side by side (interleaved).
	for _, c := range phases[len(phases)-1] {
		assert.Contains(t, []string{WRoute, WIntercept, WMCP}, c.Workload, "only the sweep reaches 10,000 sandboxes, the tunnels' up to 1,000")
	}
	var tunnel100 []string
	for _, c := range phases[1] {
		if c.Workload == WTunnel {
			tunnel100 = append(tunnel100, c.Target)
		}
	}
	assert.Equal(t, []string{"direct", "sandgate", "relay", "squid"}, tunnel100, "the tunnels are swept with their peers")
	route1000 := []string{}
	for _, c := range phases[3] {
		if c.Workload == WRoute {
			route1000 = append(route1000, c.Target)
		}
	}
	assert.Equal(t, []string{"direct", "sandgate", "relay"}, route1000)
}

// Each repetition starts every run of same-slot cells one target further on: over as many
// repetitions as targets, each target takes each place once, and the cells stay the same.
func TestRotatedMovesEveryTargetThroughEveryPlace(t *testing.T) {
	o := Options{Sandboxes: 100, Concurrency: []int{64}, Rate: 500, Workloads: []string{WRoute, WMCP}}
	targets := []*Target{{Name: "direct"}, {Name: "sandgate"}, {Name: "relay"}}
	cells := planCells(o, targets)
	places := map[string]map[int]bool{}
	for rep := range 3 {
		got := rotated(cells, rep)
		assert.ElementsMatch(t, cells, got)
		for i := 0; i < len(got); i += 3 {
			for k, c := range got[i : i+3] {
				assert.True(t, sameSlot(got[i], c), "a run stays together: %v", got[i:i+3])
				if places[c.Target] == nil {
					places[c.Target] = map[int]bool{}
				}
				places[c.Target][k] = true
			}
		}
	}
	for _, tg := range targets {
		assert.Len(t, places[tg.Name], 3, "%s took every place", tg.Name)
	}
	assert.Equal(t, cells, rotated(cells, 0), "the first repetition keeps the planned order")
}

// The fixed-rate cells a latency target reads (route, intercept and mcp at the main sandbox
// count) get the tail window; every other cell keeps its shape's window.
func TestWindowIsLongOnlyWhereATargetReadsTheTail(t *testing.T) {
	o := Options{Sandboxes: 1000, Sweep: []int{100, 1000, 10000}, Concurrency: []int{64, 512}, Rate: 500,
		RateDuration: 3 * time.Second, ClosedDuration: 2 * time.Second, TailDuration: 10 * time.Second}
	targets := []*Target{{Name: "direct"}, {Name: "sandgate"}, {Name: "relay"}, {Name: "goproxy"}}
	tail := map[string]bool{}
	for _, c := range planCells(o, targets) {
		switch d := o.window(c); {
		case c.Shape == ShapeClosed:
			assert.Equal(t, o.ClosedDuration, d, c.String())
		case d == o.TailDuration:
			assert.Equal(t, o.Sandboxes, c.Sandboxes, c.String())
			tail[c.Workload] = true
		default:
			assert.Equal(t, o.RateDuration, d, c.String())
			assert.False(t, c.Sandboxes == o.Sandboxes && (c.Workload == WRoute || c.Workload == WIntercept || c.Workload == WMCP), c.String())
		}
	}
	assert.Equal(t, map[string]bool{WRoute: true, WIntercept: true, WMCP: true}, tail)

	o.TailDuration = 0
	assert.Equal(t, o.RateDuration, o.window(Cell{Workload: WRoute, Shape: ShapeRate, Sandboxes: 1000}), "0: the rate window")
}

// The results index lists the reports present, newest first, and points at the hand-written
// HISTORY.md of reports kept only in git, which is not itself listed as a report.
func TestResultsIndexListsReportsAndHistory(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"2026-12-01-aaa-full1.md", "2026-12-02-bbb.md", "2026-12-02-0ab.md", "2026-11-30-ccc-replicas.md", "HISTORY.md"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("# x\n"), 0o644))
	}
	// Two reports of one day: the later run is listed first, whatever its commit hash.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "2026-12-02-bbb.json"), []byte(`{"time":"2026-12-02T09:00:00Z"}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "2026-12-02-0ab.json"), []byte(`{"time":"2026-12-02T15:00:00Z"}`), 0o644))
	require.NoError(t, writeResultsIndex(dir, "2026-12-02-bbb"))
	raw, err := os.ReadFile(filepath.Join(dir, "README.md"))
	require.NoError(t, err)
	index := string(raw)
	assert.Contains(t, index, "Latest: [2026-12-02-bbb.md](2026-12-02-bbb.md)")
	assert.Contains(t, index, "[HISTORY.md](HISTORY.md)")
	assert.NotContains(t, index, "| [HISTORY]", "HISTORY.md is not a report")
	assert.Contains(t, index, "| [2026-11-30-ccc-replicas](2026-11-30-ccc-replicas.md) | — | — |")
	var order []int
	for _, l := range []string{"2026-12-02-0ab", "2026-12-02-bbb", "2026-12-01-aaa-full1", "2026-11-30-ccc-replicas"} {
		i := strings.Index(index, "| ["+l+"]")
		require.Positive(t, i, "%s listed:\n%s", l, index)
		order = append(order, i)
	}
	assert.IsIncreasing(t, order, "newest first:\n%s", index)

	require.NoError(t, os.Remove(filepath.Join(dir, "HISTORY.md")))
	require.NoError(t, writeResultsIndex(dir, "2026-12-02-bbb"))
	raw, err = os.ReadFile(filepath.Join(dir, "README.md"))
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "HISTORY", "no link to a history that is not there")
}
