package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tunnelRun is one repetition of the tunnel workload's closed-loop cell against the floor and
// two of the three peers (Smokescreen skipped: not installed).
func tunnelRun() *Report {
	o := Options{Sandboxes: 200, Sweep: []int{50}, Concurrency: []int{64}, Reps: 1, Rate: 500,
		RateDuration: 1e9, TailDuration: 1e9, ClosedDuration: 1e9, Warmup: 2e8}
	var results []Result
	for i, target := range []string{"direct", "sandgate", "relay", "squid", "tinyproxy"} {
		results = append(results, Result{Cell: Cell{Workload: WTunnel, Target: target, Shape: ShapeClosed, Sandboxes: 64, Concurrency: 64},
			Requests: 1000, Throughput: 1000, P50MS: 1, P99MS: 2, CPUPerReqUS: 40 + float64(i)})
	}
	r := buildReport(o, results, nil)
	r.Versions = map[string]string{"squid": "Squid Cache: Version 6.13", "tinyproxy": "tinyproxy 1.11.2"}
	r.Skipped = []Skip{{"smokescreen", "not built (.tools/bin/smokescreen): make setup builds it"}}
	return r
}

// The report reads as a summary: the options in words (no Go map), only the targets this run
// measured, each with its floor and the peers' figures beside it, the others named once, the
// versions of the peers that ran and why the others did not.
func TestReportSummaryShowsMeasuredRowsWithFloorAndPeers(t *testing.T) {
	md := tunnelRun().Markdown("x-charts.png")
	assert.NotContains(t, md, "map[", "no Go maps")
	assert.Contains(t, md, "Run: 200 sandboxes (the swept workloads also at 50), 500 requests/s at the fixed rate, closed loop at 64 clients, 1 repetition;")
	assert.Contains(t, md, "Peers measured: Squid Cache: Version 6.13; tinyproxy 1.11.2.")
	assert.NotContains(t, md, "smokescreen v0.1.0", "no version of a peer that did not run")
	assert.Contains(t, md, "- Not measured: smokescreen: not built (.tools/bin/smokescreen): make setup builds it.")

	targets := section(t, md, "## Targets")
	var rows []string
	for _, l := range strings.Split(targets, "\n") {
		if strings.HasPrefix(l, "| tunnel") || strings.HasPrefix(l, "| route") || strings.HasPrefix(l, "| mcp") || strings.HasPrefix(l, "| intercept") || strings.HasPrefix(l, "| policy") {
			rows = append(rows, l)
		}
	}
	require.Len(t, rows, 1, "only the measured target is a row:\n%s", targets)
	assert.Equal(t, "| tunnel | CPU µs/request (c=64) | 41.00 | relay 42.00 | squid 43.00, tinyproxy 44.00 | 0.98× (0.98–0.98) | ≤ 1.05× | met |", rows[0])
	assert.NotContains(t, targets, "| —", "no row of dashes")
	assert.Contains(t, targets, "Not measured in this run (their cells were not run, or gave no figure to compare): intercept CPU µs/request (c=64);")

	checks := section(t, md, "## Other checks")
	assert.NotContains(t, checks, "| not measured", "only checks this run could make are rows")
	assert.Contains(t, checks, "Not checked in this run:")
}

// section is md from the heading to the next "## ".
func section(t *testing.T, md, heading string) string {
	t.Helper()
	i := strings.Index(md, heading+"\n")
	require.GreaterOrEqual(t, i, 0, "%s in:\n%s", heading, md)
	rest := md[i+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// A peer that is not installed is skipped, with what installs it; the bench installs nothing.
// A peer no workload of the run serves is not mentioned at all.
func TestPeersNotInstalledAreSkippedWithWhy(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no squid, no tinyproxy
	o := Options{RelayBin: "/nonexistent/bench-relay", SmokescreenBin: "/nonexistent/smokescreen", Workloads: []string{WTunnel}}
	var said []string
	o.Progress = func(s string) { said = append(said, s) }
	targets, skipped := startPeers(t.Context(), o, t.TempDir(), nil)
	assert.Empty(t, targets)
	assert.Equal(t, []Skip{
		{"relay", "not built (/nonexistent/bench-relay): make bench builds it"},
		{"squid", "not installed (squid is not on PATH): make setup installs it"},
		{"tinyproxy", "not installed (tinyproxy is not on PATH): make setup installs it"},
		{"smokescreen", "not built (/nonexistent/smokescreen): make setup builds it"},
	}, skipped, "goproxy serves only intercept, which this run does not")
	announceTargets(o, append([]*Target{{Name: "direct"}, {Name: "sandgate"}}, targets...), skipped)
	assert.Equal(t, "targets: direct, sandgate", said[0])
	assert.Contains(t, said, "skipped: squid: not installed (squid is not on PATH): make setup installs it")
}
