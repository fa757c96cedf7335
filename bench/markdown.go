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

// Markdown renders the report: how it ran, the targets it measured (with floors and peers),
// the other checks, the charts, then every cell.
func (r *Report) Markdown(chart string) string {
	var b strings.Builder
	mainN, _ := r.Options["sandboxes"].(int)
	fmt.Fprintf(&b, "# Sandgate bench %s\n\n", r.Label)
	fmt.Fprintf(&b, "%s. Machine: %s CPUs (%s), %s; load average at the end: %s.\n\n",
		r.Time.Format("2006-01-02 15:04 UTC"), r.Machine["cpus"], r.Machine["cpu"], r.Machine["go"], r.Machine["loadavg_at_end"])
	fmt.Fprintf(&b, "Run: %s.\n", r.optionsText())
	b.WriteString(r.peersText())
	for i, n := range r.Notes {
		if i == 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString(r.ratioTable())
	b.WriteString("\n## Other checks\n\n| check | this run | status |\n| --- | --- | --- |\n")
	var unchecked []string
	for _, c := range r.Checks(mainN) {
		if c.Status == "not measured" {
			unchecked = append(unchecked, c.Target)
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", c.Target, c.Value, c.Status)
	}
	if len(unchecked) > 0 {
		fmt.Fprintf(&b, "\nNot checked in this run: %s.\n", strings.Join(unchecked, "; "))
	}
	fmt.Fprintf(&b, "\n## Added latency against sandbox count\n\nOne chart per workload: Sandgate, its floor and every peer "+
		"that serves the workload, at each sandbox count of the run (fixed rate; p99 solid, p50 dashed).\n\n![charts](%s)\n", chart)
	b.WriteString("\n## How it was measured\n\n")
	b.WriteString("Every target is its own process on loopback; cells are interleaved (each workload and shape: every target in turn), " +
		"medians over repetitions, in phases of one sandbox count, fewest first (no cell follows a larger count's; a cell's sandboxes end their MCP sessions when it is over). Latency of fixed-rate cells counts from the scheduled send time (open loop). " +
		"*Added* = target percentile − direct percentile in the same run. CPU = proxy process group's user+system time per completed request " +
		"(" + r.Machine["cpu_source"] + ", sampled at the two ends of the window while the load runs). Upstream conns/handshakes are those of the TLS model-API stand-in during the window " +
		"(tunnel workloads open one upstream connection per tunnel by design).\n")
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
	return b.String()
}

// optionsText is the run's options in words: "200 sandboxes (sweep 50), 500 requests/s, …".
func (r *Report) optionsText() string {
	o := r.Options
	ints := func(k string) []string {
		v, _ := o[k].([]int)
		out := make([]string, len(v))
		for i, n := range v {
			out[i] = fmt.Sprint(n)
		}
		return out
	}
	s := fmt.Sprintf("%v sandboxes", o["sandboxes"])
	sweep := slices.DeleteFunc(ints("sweep"), func(n string) bool { return n == fmt.Sprint(o["sandboxes"]) })
	if len(sweep) > 0 {
		s += " (the swept workloads also at " + andList(sweep) + ")"
	}
	s += fmt.Sprintf(", %v requests/s at the fixed rate, closed loop at %s clients", o["rate"], andList(ints("concurrency")))
	reps, _ := o["reps"].(int)
	s += fmt.Sprintf(", %d repetition", reps)
	if reps != 1 {
		s += "s"
	}
	s += fmt.Sprintf("; windows: fixed rate %v (%v where a latency target reads it), closed loop %v, warm-up %v",
		o["rate_duration"], o["tail_duration"], o["closed_duration"], o["warmup"])
	if sl, _ := o["slice"].(string); sl != "" && sl != "0s" {
		s += fmt.Sprintf("; closed-loop targets take turns every %s within the window", sl)
	}
	return s
}

// andList writes "a, b and c".
func andList(xs []string) string {
	if len(xs) < 2 {
		return strings.Join(xs, "")
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " and " + xs[len(xs)-1]
}

// peersText names the peers this run measured, with their versions, and those it skipped, with
// why.
func (r *Report) peersText() string {
	var b strings.Builder
	var measured []string
	for _, p := range peerNames {
		if v, ok := r.Versions[p]; ok {
			measured = append(measured, v)
		}
	}
	if len(measured) > 0 {
		fmt.Fprintf(&b, "\nPeers measured: %s.\n", strings.Join(measured, "; "))
	}
	for i, s := range r.Skipped {
		if i == 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "- Not measured: %s: %s.\n", s.Target, s.Why)
	}
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
