package bench

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Targets take turns in rounds, every target once a round, the order reversed every other round:
// no target always follows the same one.
func TestSliceOrderAlternates(t *testing.T) {
	assert.Equal(t, [][]int{{0, 1, 2}, {2, 1, 0}, {0, 1, 2}, {2, 1, 0}}, sliceOrder(4, 3))
	assert.Equal(t, [][]int{{0}}, sliceOrder(1, 1))
	for _, round := range sliceOrder(5, 4) {
		assert.ElementsMatch(t, []int{0, 1, 2, 3}, round, "every target once a round")
	}
}

// A sliced slot measures its cells one slice at a time: each cell's figures cover its whole
// window (the sum of its slices), and the cells' windows follow each other rather than overlap.
func TestSlicedCellsTakeTurnsAndCoverTheirWindow(t *testing.T) {
	ctx := context.Background()
	up, err := StartUpstreams(ctx, t.TempDir())
	require.NoError(t, err)
	defer up.Stop()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(up.CACertPEM()))
	rn := &runner{env: &clientEnv{up: up, roots: roots, timeout: 5 * time.Second}}

	direct := &Target{Name: "direct", MCPURL: up.MCPURL}
	cells := []Cell{
		{Workload: WRoute, Target: "direct", Shape: ShapeClosed, Sandboxes: 4, Concurrency: 4},
		{Workload: WRoute, Target: "direct", Shape: ShapeClosed, Sandboxes: 2, Concurrency: 2},
	}
	const d, slice = 400 * time.Millisecond, 100 * time.Millisecond
	began := time.Now()
	res, err := rn.runSliced(ctx, []*Target{direct, direct}, cells, d, slice, 3)
	took := time.Since(began)
	require.NoError(t, err)
	require.Len(t, res, 2)
	var windows time.Duration
	for i, r := range res {
		assert.Equal(t, cells[i], r.Cell)
		assert.Equal(t, 3, r.Rep)
		assert.Zero(t, r.Errors, r.FirstError)
		assert.Positive(t, r.Requests)
		assert.GreaterOrEqual(t, r.Seconds, d.Seconds(), "the window is four slices of 100 ms")
		windows += time.Duration(r.Seconds * float64(time.Second))
	}
	assert.GreaterOrEqual(t, took, windows, "one cell's slice at a time")
}
