package bench

import (
	"testing"

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
		assert.Contains(t, []string{WRoute, WIntercept, WMCP}, c.Workload, "only the sweep reaches 10,000 sandboxes")
	}
	route1000 := []string{}
	for _, c := range phases[3] {
		if c.Workload == WRoute {
			route1000 = append(route1000, c.Target)
		}
	}
	assert.Equal(t, []string{"direct", "sandgate", "relay"}, route1000)
}
