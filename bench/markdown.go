package bench

import (
	"fmt"
	"slices"
	"strings"
)

func (r *Report) row(w, target, shape string, n int) (Row, bool) {
	for _, x := range r.Rows {
		if x.Workload == w && x.Target == target && x.Shape == shape &&
			((shape == ShapeRate && x.Sandboxes == n) || (shape == ShapeClosed && x.Concurrency == n)) {
			return x, true
		}
	}
	return Row{}, false
}

// Check is one target of the issue, evaluated on this run.
type Check struct {
	Target string `json:"target"`
	Value  string `json:"value"`
	Status string `json:"status"` // met, missed, not measured
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// checks collects the targets' verdicts.
type checks []Check

func (cs *checks) add(target, value string, ok, measured bool) {
	st := verdict(ok)
	if !measured {
		st, value = "not measured", "—"
	}
	*cs = append(*cs, Check{target, value, st})
}

// Checks evaluates the targets on the medians of this run.
func (r *Report) Checks(mainN int) []Check {
	var cs checks
	r.checkLatency(&cs, mainN)
	r.checkResources(&cs)
	r.checkPolicy(&cs)
	return cs
}

func (r *Report) checkLatency(cs *checks, mainN int) {
	add := cs.add
	for _, w := range []string{WTunnel, WTunnelNew} {
		a, ok1 := r.row(w, "sandgate", ShapeClosed, 512)
		b, ok2 := r.row(w, "squid", ShapeClosed, 512)
		add(fmt.Sprintf("p99 at 512 clients ≤ Squid's (%s)", w), fmt.Sprintf("%.2f ms vs Squid %.2f ms", a.P99MS, b.P99MS), a.P99MS <= b.P99MS, ok1 && ok2)
	}
	rt, ok := r.row(WRoute, "sandgate", ShapeRate, mainN)
	add(fmt.Sprintf("Fixed rate, %d sandboxes: route added p50 ≤ 0.3 ms", mainN), fmt.Sprintf("%.3f ms", rt.AddedP50MS), rt.AddedP50MS <= 0.3, ok && rt.HasDirect)
	add(fmt.Sprintf("Fixed rate, %d sandboxes: route added p99 ≤ 2 ms", mainN), fmt.Sprintf("%.3f ms", rt.AddedP99MS), rt.AddedP99MS <= 2, ok && rt.HasDirect)
	mc, ok := r.row(WMCP, "sandgate", ShapeRate, mainN)
	value := fmt.Sprintf("%.3f ms", mc.AddedP50MS)
	if fl, okf := r.row(WMCP, "relay", ShapeRate, mainN); okf && fl.HasDirect {
		value += fmt.Sprintf(" (bare mcp-go server and client: %.3f ms)", fl.AddedP50MS)
	}
	add(fmt.Sprintf("Fixed rate, %d sandboxes: tools/call added p50 ≤ 0.5 ms", mainN), value, mc.AddedP50MS <= 0.5, ok && mc.HasDirect)
}

func (r *Report) checkResources(cs *checks) {
	add := cs.add
	var errs int64
	var cells int
	for _, x := range r.Rows {
		if x.Target == "sandgate" {
			errs += x.Errors
			cells++
		}
	}
	add("Zero errors (every Sandgate cell)", fmt.Sprintf("%d errors over %d cells", errs, cells), errs == 0, cells > 0)
	var peak, hs, reqs int64
	measured := false
	for _, x := range r.Rows {
		if x.Target == "sandgate" && (x.Workload == WRoute || x.Workload == WIntercept) {
			peak = max(peak, x.UpstreamPeak)
			hs += x.TLSHandshakes
			reqs += x.Requests / int64(max(x.Reps, 1))
			measured = true
		}
	}
	add("Upstream TCP connections to the model-API host ≤ 64 (route, intercept; peak)", fmt.Sprint(peak), peak <= 64, measured)
	add("No TLS handshake per request after warm-up (route, intercept)", fmt.Sprintf("%d handshakes for %d requests", hs, reqs), hs*100 <= reqs, measured)
}

func (r *Report) checkPolicy(cs *checks) {
	add := cs.add
	for _, mode := range []struct{ name, label string }{
		{"cached", "repeated input (decision cache)"},
		{"evaluated", "input seen first (OPA evaluation)"},
	} {
		var parts []string
		worst := 0.0
		for _, f := range r.Policy {
			if f.Mode == mode.name && f.Round == 0 {
				parts = append(parts, fmt.Sprintf("%s %.1f µs (%d allocs)", f.Case, f.NsPerOp/1e3, f.AllocsPerOp))
				worst = max(worst, f.NsPerOp/1e3)
			}
		}
		add("Policy decision ≤ 20 µs, "+mode.label+" (Go benchmark in process)", strings.Join(parts, ", "), worst <= 20, len(parts) > 0)
	}
}

// Markdown renders the report.
func (r *Report) Markdown(chart string) string {
	var b strings.Builder
	mainN, _ := r.Options["sandboxes"].(int)
	fmt.Fprintf(&b, "# Sandgate bench %s\n\n", r.Label)
	fmt.Fprintf(&b, "%s. Machine: %s CPUs (%s), %s; load average at the end: %s. Options: %v.\n\n",
		r.Time.Format("2006-01-02 15:04 UTC"), r.Machine["cpus"], r.Machine["cpu"], r.Machine["go"], r.Machine["loadavg_at_end"], r.Options)
	b.WriteString("Every target is its own process on loopback; cells are interleaved (each workload and shape: every target in turn), " +
		"medians over repetitions, in phases of one sandbox count, fewest first (no cell follows a larger count's; a cell's sandboxes end their MCP sessions when it is over). Latency of fixed-rate cells counts from the scheduled send time (open loop). " +
		"*Added* = target percentile − direct percentile in the same run. CPU = proxy process group's user+system time per completed request " +
		"(" + r.Machine["cpu_source"] + ", sampled at the two ends of the window while the load runs). Upstream conns/handshakes are those of the TLS model-API stand-in during the window " +
		"(tunnel workloads open one upstream connection per tunnel by design).\n\n")
	if len(r.Versions) > 0 {
		fmt.Fprintf(&b, "Peers: %v.\n\n", r.Versions)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString(r.ratioTable())
	b.WriteString("\n## Other checks\n\n| check | this run | status |\n| --- | --- | --- |\n")
	for _, c := range r.Checks(mainN) {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", c.Target, c.Value, c.Status)
	}
	b.WriteString(r.floorTable(mainN))
	b.WriteString("\n## Fixed rate\n\n")
	b.WriteString("| sandboxes | workload | target | req/s | p50 | p90 | p99 | added p50 | added p90 | added p99 | errors | CPU µs/req | RSS MB (end / peak) | goroutines/threads | open files | upstream conns (new/peak) | TLS handshakes | loadgen cores | stand-ins CPU µs/req |\n")
	b.WriteString("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	rows := slices.Clone(r.Rows)
	slices.SortStableFunc(rows, func(a, c Row) int { return a.Sandboxes - c.Sandboxes })
	for _, x := range rows {
		if x.Shape == ShapeRate {
			b.WriteString(mdRow(x, true))
		}
	}
	for _, c := range []int{64, 512} {
		fmt.Fprintf(&b, "\n## Closed loop, %d concurrent clients\n\n", c)
		b.WriteString("| workload | target | req/s | p50 | p90 | p99 | errors | CPU µs/req | RSS MB (end / peak) | goroutines/threads | open files | upstream conns (new/peak) | TLS handshakes | loadgen cores | stand-ins CPU µs/req |\n")
		b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, x := range r.Rows {
			if x.Shape == ShapeClosed && x.Concurrency == c {
				b.WriteString(mdRow(x, false))
			}
		}
	}
	var errs []string
	for _, x := range r.Rows {
		if x.FirstError != "" {
			errs = append(errs, fmt.Sprintf("- %s: %d errors; first: `%s`", x.Cell, x.Errors, strings.ReplaceAll(x.FirstError, "`", "'")))
		}
	}
	if len(errs) > 0 {
		b.WriteString("\n## Errors\n\n" + strings.Join(errs, "\n") + "\n")
	}
	fmt.Fprintf(&b, "\n## Added latency against sandbox count\n\n![latency vs sandboxes](%s)\n", chart)
	return b.String()
}

func mdRow(x Row, rate bool) string {
	dash := func(v float64, f string) string {
		if v == 0 {
			return "—"
		}
		return fmt.Sprintf(f, v)
	}
	gt := "—"
	if x.Goroutines > 0 {
		gt = fmt.Sprintf("%d g", x.Goroutines)
	} else if x.Threads > 0 {
		gt = fmt.Sprintf("%d t", x.Threads)
	}
	files := "—"
	if x.Files > 0 {
		files = fmt.Sprint(x.Files)
	}
	common := fmt.Sprintf("%s | %s | %.0f | %.2f | %.2f | %.2f |", x.Workload, x.Target, x.Throughput, x.P50MS, x.P90MS, x.P99MS)
	added := ""
	if rate {
		if x.HasDirect {
			added = fmt.Sprintf(" %+.2f | %+.2f | %+.2f |", x.AddedP50MS, x.AddedP90MS, x.AddedP99MS)
		} else {
			added = " — | — | — |"
		}
		common = fmt.Sprintf("| %d | %s", x.Sandboxes, common) + added
	} else {
		common = "| " + common
	}
	lg := fmt.Sprintf("%.2f", x.LoadgenCores)
	if x.LoadgenCores > loadgenSaturated {
		lg += " ⚠"
	}
	return common + fmt.Sprintf(" %d | %s | %s | %s | %s | %d/%d | %d | %s | %s |\n", x.Errors, dash(x.CPUPerReqUS, "%.1f"),
		rss(x), gt, files, x.UpstreamOpened, x.UpstreamPeak, x.TLSHandshakes, lg, dash(x.UpstreamCPUPerReqUS, "%.1f"))
}

// rss is the resident set at the end of the window and its peak during it (VmHWM, reset at the
// start of the window; the largest over repetitions).
func rss(x Row) string {
	if x.RSSBytes == 0 {
		return "—"
	}
	if x.PeakRSSBytes == 0 {
		return fmt.Sprintf("%.1f", float64(x.RSSBytes)/(1<<20))
	}
	return fmt.Sprintf("%.1f / %.1f", float64(x.RSSBytes)/(1<<20), float64(x.PeakRSSBytes)/(1<<20))
}

// floorTable sets Sandgate against the bare Go relay (bench/cmd/relay) on the workloads both
// serve: what policy, identity, injection, parsing and audit cost over the least any Go proxy
// does.
func (r *Report) floorTable(mainN int) string {
	var b strings.Builder
	row := func(w, measure string, sg, rl float64, ok bool) {
		if ok && rl > 0 {
			fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %.2f× |\n", w, measure, sg, rl, sg/rl)
		}
	}
	for _, w := range []string{WRoute, WRouteConv, WIntercept, WMCP, WTunnel, WTunnelNew} {
		floor := "relay"
		if w == WIntercept {
			floor = "goproxy"
		}
		s, ok1 := r.row(w, "sandgate", ShapeClosed, 64)
		l, ok2 := r.row(w, floor, ShapeClosed, 64)
		row(w, "CPU µs/request (c=64)", s.CPUPerReqUS, l.CPUPerReqUS, ok1 && ok2)
		row(w, "throughput req/s (c=64)", s.Throughput, l.Throughput, ok1 && ok2)
		s, ok1 = r.row(w, "sandgate", ShapeRate, mainN)
		l, ok2 = r.row(w, floor, ShapeRate, mainN)
		ok := ok1 && ok2 && s.HasDirect && l.HasDirect
		row(w, fmt.Sprintf("added p50 ms (fixed rate, %d sandboxes)", mainN), s.AddedP50MS, l.AddedP50MS, ok)
		row(w, fmt.Sprintf("added p99 ms (fixed rate, %d sandboxes)", mainN), s.AddedP99MS, l.AddedP99MS, ok)
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n## Against the bare Go floor\n\nThe relay target is the least a Go proxy does: a CONNECT relay, and for the route a bare " +
		"`httputil.ReverseProxy` over one pooled HTTP/2 transport that sets the API key, and for MCP an mcp-go server whose tools forward to one mcp-go client " +
		"session. For the intercept workload the floor " +
		"is goproxy's own TLS interception (cached leaves, the same pooled transport, nothing added). Sandgate adds identity, " +
		"policy, key injection, body and usage parsing, limits and audit.\n\n| workload | measure | Sandgate | bare Go | ratio |\n" +
		"| --- | --- | ---: | ---: | ---: |\n" + b.String()
}
