package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The policy variants are cells of their own beside "sandgate" on route and mcp only, and their
// ratios divide the variant's figure by sandgate's of the same repetition.
func TestPolicyVariantRatios(t *testing.T) {
	o := Options{Sandboxes: 200, Concurrency: []int{64}, Rate: 500, Workloads: []string{WRoute, WMCP, WIntercept}}
	targets := []*Target{{Name: "direct"}, {Name: "sandgate"}, {Name: "declog"}, {Name: "shadow"}, {Name: "otlp"}}
	for _, c := range planCells(o, targets) {
		if c.Target == "declog" || c.Target == "shadow" || c.Target == "otlp" {
			assert.Contains(t, []string{WRoute, WMCP}, c.Workload)
		}
	}

	closed := func(target string, rep int, cpu float64) Result {
		return Result{Cell: Cell{Workload: WRoute, Target: target, Shape: ShapeClosed, Concurrency: 64}, Rep: rep, CPUPerReqUS: cpu}
	}
	rate := func(target string, rep int, p50 float64) Result {
		return Result{Cell: Cell{Workload: WMCP, Target: target, Shape: ShapeRate, Sandboxes: 200}, Rep: rep, P50MS: p50}
	}
	r := &Report{Results: []Result{
		closed("sandgate", 0, 100), closed("declog", 0, 105), closed("sandgate", 1, 100), closed("declog", 1, 120),
		closed("sandgate", 2, 100), closed("declog", 2, 108),
		rate("direct", 0, 1), rate("sandgate", 0, 2), rate("shadow", 0, 3),
	}}
	byName := map[string]Ratio{}
	for _, x := range r.Ratios(200, []int{64}) {
		byName[x.Workload+" "+x.Measure] = x
	}
	log := byName[WRoute+" CPU µs/request (c=64), decision log on vs off"]
	require.True(t, log.Measured)
	assert.Equal(t, []float64{1.05, 1.2, 1.08}, log.PerRep)
	assert.InDelta(t, 1.08, log.Ratio, 1e-9)
	assert.True(t, log.Met)
	assert.False(t, byName[WMCP+" CPU µs/request (c=64), decision log on vs off"].Measured, "no mcp cells: not measured")

	shadow := byName[WMCP+" p50 ms (fixed rate), shadow policy vs none, 200 sandboxes"]
	require.True(t, shadow.Measured)
	assert.InDelta(t, 1.5, shadow.Ratio, 1e-9)
	assert.False(t, shadow.Met)
}

// Issue 57's two ratios: the minted Sandgate's CPU per request over the static one's, in the
// closed loop and at the fixed rate, each repetition against its own.
func TestMintedRatiosInTheClosedLoopAndAtTheFixedRate(t *testing.T) {
	res := func(shape, target string, rep int, cpu float64) Result {
		c := Cell{Workload: WRoute, Target: target, Shape: shape, Concurrency: 64}
		if shape == ShapeRate {
			c = Cell{Workload: WRoute, Target: target, Shape: shape, Sandboxes: 200}
		}
		return Result{Cell: c, Rep: rep, CPUPerReqUS: cpu}
	}
	r := &Report{Results: []Result{
		res(ShapeClosed, "sandgate", 0, 100), res(ShapeClosed, "minted", 0, 106),
		res(ShapeClosed, "sandgate", 1, 100), res(ShapeClosed, "minted", 1, 108),
		res(ShapeRate, "direct", 0, 0), res(ShapeRate, "sandgate", 0, 200), res(ShapeRate, "minted", 0, 202),
		res(ShapeRate, "direct", 1, 0), res(ShapeRate, "sandgate", 1, 200), res(ShapeRate, "minted", 1, 198),
	}}
	byName := map[string]Ratio{}
	for _, x := range r.Ratios(200, []int{64}) {
		byName[x.Measure] = x
	}
	closed := byName["CPU µs/request (c=64), minted credential vs static"]
	require.True(t, closed.Measured)
	assert.Equal(t, []float64{1.06, 1.08}, closed.PerRep)
	assert.False(t, closed.Met)
	rate := byName["CPU µs/request (fixed rate), minted credential vs static, 200 sandboxes"]
	require.True(t, rate.Measured, "%v", byName)
	assert.InDeltaSlice(t, []float64{1.01, 0.99}, rate.PerRep, 1e-9)
	assert.True(t, rate.Met)
}
