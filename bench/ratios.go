package bench

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The fast path is judged by ratios against floors measured in the same run, interleaved (the
// machines are shared; an absolute figure moves 20–50% between runs of the same code, a ratio
// of two cells measured seconds apart much less). Each ratio is computed per repetition, from
// that repetition's two cells, and reported as the median with its min–max.

// Ratio is one target of the fast-path issue, evaluated on this run.
type Ratio struct {
	Workload string    `json:"workload"`
	Measure  string    `json:"measure"`
	Floor    string    `json:"floor"`    // the target it is compared with
	Sandgate float64   `json:"sandgate"` // median over repetitions
	FloorVal float64   `json:"floor_value"`
	Ratio    float64   `json:"ratio"` // median of the per-repetition ratios
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	PerRep   []float64 `json:"per_rep"`
	Target   float64   `json:"target"`
	AtLeast  bool      `json:"at_least,omitempty"` // the ratio must be ≥ Target (else ≤)
	// Difference says Ratio (and PerRep, Min, Max) is Sandgate's figure minus the floor's, in
	// the measure's unit, not their quotient (deliveryP50).
	Difference bool `json:"difference,omitempty"`
	Met        bool `json:"met"`
	Measured   bool `json:"measured"`
	// LoadgenSaturated is set when the generator used more than loadgenSaturated of a core in a
	// cell of this ratio: the cell may have measured the generator, not the proxy.
	LoadgenSaturated bool   `json:"loadgen_saturated,omitempty"`
	Note             string `json:"note,omitempty"`
	// Peers are the other proxies' figures for the same measure and cell (median over
	// repetitions), where they serve the workload: Squid, tinyproxy and Smokescreen on the
	// tunnel workloads.
	Peers map[string]float64 `json:"peers,omitempty"`
}

// absolute marks a target with no floor (RSS per sandbox: no floor keeps sandbox state).
const absolute = "(absolute)"

// loadgenSaturated is the generator CPU (cores) above which a cell is flagged.
const loadgenSaturated = 0.9

// Targets in cmp form, printed with their ratio.
func (x Ratio) TargetText() string {
	if x.Difference {
		return fmt.Sprintf("≤ +%.2f", x.Target)
	}
	if x.Floor == absolute {
		return fmt.Sprintf("≤ %.0f", x.Target)
	}
	if x.AtLeast {
		return fmt.Sprintf("≥ %.2f×", x.Target)
	}
	return fmt.Sprintf("≤ %.2f×", x.Target)
}

// ratioSpec names one ratio: a measure of a workload, Sandgate against a floor.
type ratioSpec struct {
	workload, floor string
	target          string // measured against floor; "" is "sandgate"
	measure         string
	limit           float64
	atLeast         bool
	cell            func(mainN, maxC int) (shape string, n int)
	value           func(sg, direct Result) float64
}

var (
	cpuC64   = func(int, int) (string, int) { return ShapeClosed, 64 }
	rateMain = func(mainN, _ int) (string, int) { return ShapeRate, mainN }
	satMax   = func(_, maxC int) (string, int) { return ShapeClosed, maxC }
	cpuOf    = func(x, _ Result) float64 { return x.CPUPerReqUS }
	addedP99 = func(x, d Result) float64 { return x.P99MS - d.P99MS }
	rpsOf    = func(x, _ Result) float64 { return x.Throughput }
	p50Of    = func(x, _ Result) float64 { return x.P50MS }
)

// ratioSpecs are the targets (bench/README.md "Targets").
var ratioSpecs = []ratioSpec{
	{WIntercept, "goproxy", "", "CPU µs/request (c=64)", 1.10, false, cpuC64, cpuOf},
	{WRoute, "relay", "", "CPU µs/request (c=64)", 1.10, false, cpuC64, cpuOf},
	{WRouteConv, "relay", "", "CPU µs/request (c=64)", 1.20, false, cpuC64, cpuOf},
	{WTunnel, "relay", "", "CPU µs/request (c=64)", 1.05, false, cpuC64, cpuOf},
	{WTunnelNew, "relay", "", "CPU µs/request (c=64)", 1.10, false, cpuC64, cpuOf},
	{WMCP, "relay", "", "CPU µs/request (c=64)", 0.90, false, cpuC64, cpuOf}, // issue #56
	{WRoute, "relay", "", "added p99 ms (fixed rate)", 1.25, false, rateMain, addedP99},
	{WIntercept, "goproxy", "", "added p99 ms (fixed rate)", 1.25, false, rateMain, addedP99},
	{WMCP, "relay", "", "added p99 ms (fixed rate)", 1.00, false, rateMain, addedP99}, // issue #56
	{WRoute, "relay", "", "saturation req/s (closed loop, most clients)", 0.95, true, satMax, rpsOf},
	{WIntercept, "goproxy", "", "saturation req/s (closed loop, most clients)", 0.95, true, satMax, rpsOf},
	// Issue #21: what the decision log and a shadow policy cost (Options.PolicyVariants).
	{WRoute, "sandgate", "declog", "CPU µs/request (c=64), decision log on vs off", 1.10, false, cpuC64, cpuOf},
	{WMCP, "sandgate", "declog", "CPU µs/request (c=64), decision log on vs off", 1.10, false, cpuC64, cpuOf},
	{WRoute, "sandgate", "shadow", "p50 ms (fixed rate), shadow policy vs none", 1.10, false, rateMain, p50Of},
	{WMCP, "sandgate", "shadow", "p50 ms (fixed rate), shadow policy vs none", 1.10, false, rateMain, p50Of},
	// Issue #36: what blocking audit delivery costs against async (Options.DeliveryVariants);
	// its added p50 is deliveryP50.
	{WRoute, "async", "", "CPU µs/request (c=64), blocking vs async audit delivery", 1.05, false, cpuC64, cpuOf},
	{WIntercept, "async", "", "CPU µs/request (c=64), blocking vs async audit delivery", 1.05, false, cpuC64, cpuOf},
	{WMCP, "async", "", "CPU µs/request (c=64), blocking vs async audit delivery", 1.05, false, cpuC64, cpuOf},
	// Issue #37: what exporting the audit log over OTLP costs (Options.ExportVariants).
	{WRoute, "sandgate", "otlp", "CPU µs/request (c=64), audit OTLP export on vs off", 1.05, false, cpuC64, cpuOf},
	{WMCP, "sandgate", "otlp", "CPU µs/request (c=64), audit OTLP export on vs off", 1.05, false, cpuC64, cpuOf},
	// Issue #57: what a credential minted per run costs against a static one (Options.CredentialVariants).
	// In the closed loop a target that costs a little more per request serves fewer requests,
	// and fewer requests a second cost every process more each (fewer answers share a write, a
	// wakeup): the stand-ins, whose work per request is the same for both, cost 4-7% more per
	// request for the minted Sandgate's. At a fixed rate both serve (`-rate 4000`: the rate
	// cells take turns too, whole windows), the throughput is the same and the ratio is the
	// credential's cost per request alone (bench/README.md, docs/performance.md run I).
	{WRoute, "sandgate", "minted", "CPU µs/request (c=64), minted credential vs static", 1.05, false, cpuC64, cpuOf},
	{WRoute, "sandgate", "minted", "CPU µs/request (fixed rate), minted credential vs static", 1.05, false, rateMain, cpuOf},
}

// readsRateCell reports whether a target reads w's fixed-rate cell at the main sandbox count.
func readsRateCell(w string) bool {
	return slices.ContainsFunc(ratioSpecs, func(sp ratioSpec) bool {
		shape, _ := sp.cell(0, 0)
		return sp.workload == w && shape == ShapeRate
	})
}

// Ratios evaluates every target on the run's results.
func (r *Report) Ratios(mainN int, concurrency []int) []Ratio {
	maxC := 0
	if len(concurrency) > 0 {
		maxC = slices.Max(concurrency)
	}
	var out []Ratio
	for _, sp := range ratioSpecs {
		shape, n := sp.cell(mainN, maxC)
		target := cmp.Or(sp.target, "sandgate")
		x := Ratio{Workload: sp.workload, Measure: sp.measure, Floor: sp.floor, Target: sp.limit, AtLeast: sp.atLeast}
		if shape == ShapeRate {
			x.Measure = fmt.Sprintf("%s, %d sandboxes", sp.measure, n)
		} else if !strings.HasPrefix(sp.measure, "CPU µs/request (c=64)") {
			x.Measure = fmt.Sprintf("%s c=%d", sp.measure, n)
		}
		var sgs, fls []float64
		for _, rep := range r.reps() {
			sg, ok1 := r.result(sp.workload, target, shape, n, rep)
			fl, ok2 := r.result(sp.workload, sp.floor, shape, n, rep)
			dr, ok3 := r.result(sp.workload, "direct", shape, n, rep)
			if !ok1 || !ok2 || (shape == ShapeRate && !ok3) {
				continue
			}
			a, b := sp.value(sg, dr), sp.value(fl, dr)
			if b <= 0 || a <= 0 {
				continue
			}
			sgs, fls = append(sgs, a), append(fls, b)
			x.PerRep = append(x.PerRep, a/b)
			x.LoadgenSaturated = x.LoadgenSaturated || sg.LoadgenCores > loadgenSaturated || fl.LoadgenCores > loadgenSaturated
		}
		if len(x.PerRep) > 0 {
			x.Measured = true
			x.Sandgate, x.FloorVal, x.Ratio = median(sgs), median(fls), median(x.PerRep)
			x.Min, x.Max = slices.Min(x.PerRep), slices.Max(x.PerRep)
			x.Met = x.Ratio <= x.Target
			if x.AtLeast {
				x.Met = x.Ratio >= x.Target
			}
			if sp.target == "" {
				x.Peers = r.peerValues(sp, shape, n)
			}
		}
		out = append(out, x)
	}
	out = append(out, r.deliveryP50(WRoute, mainN), r.deliveryP50(WMCP, mainN), r.policyRatio())
	for _, t := range rssTargets {
		out = append(out, r.rssPerSandbox(t.from, t.atLeast, t.kb))
	}
	return out
}

// peerValues is each peer's figure for sp's measure on one cell, median over repetitions.
func (r *Report) peerValues(sp ratioSpec, shape string, n int) map[string]float64 {
	var out map[string]float64
	for _, peer := range peerNames {
		var vs []float64
		for _, rep := range r.reps() {
			x, ok1 := r.result(sp.workload, peer, shape, n, rep)
			d, ok2 := r.result(sp.workload, "direct", shape, n, rep)
			if ok1 && (ok2 || shape != ShapeRate) {
				if v := sp.value(x, d); v > 0 {
					vs = append(vs, v)
				}
			}
		}
		if len(vs) > 0 {
			if out == nil {
				out = map[string]float64{}
			}
			out[peer] = median(vs)
		}
	}
	return out
}

// deliveryP50 is what blocking audit delivery adds to the p50 at the fixed rate against async
// delivery (Options.DeliveryVariants), in ms: per repetition the difference of the two cells'
// p50, interleaved; the median must stay within 0.5 ms.
func (r *Report) deliveryP50(w string, mainN int) Ratio {
	x := Ratio{Workload: w, Measure: fmt.Sprintf("added p50 ms (fixed rate), blocking vs async audit delivery, %d sandboxes", mainN),
		Floor: "async", Target: 0.5, Difference: true}
	var sgs, fls []float64
	for _, rep := range r.reps() {
		sg, ok1 := r.result(w, "sandgate", ShapeRate, mainN, rep)
		fl, ok2 := r.result(w, "async", ShapeRate, mainN, rep)
		if !ok1 || !ok2 || sg.P50MS <= 0 || fl.P50MS <= 0 {
			continue
		}
		sgs, fls = append(sgs, sg.P50MS), append(fls, fl.P50MS)
		x.PerRep = append(x.PerRep, sg.P50MS-fl.P50MS)
		x.LoadgenSaturated = x.LoadgenSaturated || sg.LoadgenCores > loadgenSaturated || fl.LoadgenCores > loadgenSaturated
	}
	if len(x.PerRep) > 0 {
		x.Measured = true
		x.Sandgate, x.FloorVal, x.Ratio = median(sgs), median(fls), median(x.PerRep)
		x.Min, x.Max = slices.Min(x.PerRep), slices.Max(x.PerRep)
		x.Met = x.Ratio <= x.Target
	}
	return x
}

// policyRatio is the first-seen decision on the shipped policies against OPA's evaluation of a
// one-line policy in the same benchmark run (benchPolicy).
func (r *Report) policyRatio() Ratio {
	x := Ratio{Workload: "policy", Measure: "first-seen decision ns (shipped policies, worst case)", Floor: "OPA one-line policy",
		Target: 1.5}
	type key struct {
		round int
		c     string
	}
	base, eval := map[key]float64{}, map[key]float64{}
	for _, f := range r.Policy {
		switch f.Mode {
		case "baseline":
			base[key{f.Round, f.Case}] = f.NsPerOp
		case "evaluated":
			eval[key{f.Round, f.Case}] = f.NsPerOp
		}
	}
	// Per round, the worst case's ratio; the median over rounds decides.
	worst := map[int]float64{}
	var sgs, fls []float64
	for k, b := range base {
		if e := eval[k]; b > 0 && e > 0 && e/b > worst[k.round] {
			worst[k.round] = e / b
			sgs, fls = append(sgs, e), append(fls, b)
		}
	}
	for round := range policyRounds {
		if v, ok := worst[round]; ok {
			x.PerRep = append(x.PerRep, v)
		}
	}
	if len(x.PerRep) > 0 {
		x.Measured, x.Ratio, x.Sandgate, x.FloorVal = true, median(x.PerRep), median(sgs), median(fls)
		x.Min, x.Max = slices.Min(x.PerRep), slices.Max(x.PerRep)
		x.Met = x.Ratio <= x.Target
		x.Note = "per round, the worse of model_request and tools_call"
	}
	return x
}

// rssTargets are the MCP half's memory per connected idle sandbox (issue #56): what each
// sandbox adds beyond 2,000 (the RSS of the largest fixed-rate MCP cell of 10,000 or more,
// less that of the 2,000 cell, over the sandboxes between them: the process's own memory,
// its heap floor, and the garbage of the load both cells carry cancel out), and the whole
// process's RSS over its sandboxes at 10,000 or more.
var rssTargets = []struct {
	from    int // 0: whole process
	atLeast int
	kb      float64
}{{2000, 10000, 16}, {0, 10000, 32}}

// rssPerSandbox is that measure: the fixed-rate MCP cells of Sandgate at from (0: none) and at
// the largest count of atLeast or more; the target is absolute (no floor keeps sandbox state).
func (r *Report) rssPerSandbox(from, atLeast int, kb float64) Ratio {
	x := Ratio{Workload: WMCP, Measure: fmt.Sprintf("RSS KB per connected sandbox (largest fixed-rate cell, ≥ %d sandboxes)", atLeast),
		Floor: absolute, Target: kb}
	if from > 0 {
		x.Measure = fmt.Sprintf("RSS KB per connected sandbox added beyond %d (to the largest fixed-rate cell, ≥ %d)", from, atLeast)
	}
	var lo, big Row
	for _, row := range r.Rows {
		if row.Target != "sandgate" || row.Shape != ShapeRate || row.Workload != WMCP {
			continue
		}
		if row.Sandboxes == from {
			lo = row
		}
		if row.Sandboxes >= atLeast && row.Sandboxes > big.Sandboxes {
			big = row
		}
	}
	if big.Sandboxes == 0 || big.RSSBytes == 0 || from > 0 && lo.RSSBytes == 0 {
		return x
	}
	v := big.RSSPerSBKB
	x.Note = fmt.Sprintf("%d sandboxes", big.Sandboxes)
	if from > 0 {
		v = float64(big.RSSBytes-lo.RSSBytes) / 1024 / float64(big.Sandboxes-from)
		x.Note = fmt.Sprintf("%d → %d sandboxes: %.1f → %.1f MB", from, big.Sandboxes, float64(lo.RSSBytes)/(1<<20), float64(big.RSSBytes)/(1<<20))
	}
	x.Sandgate, x.Ratio, x.Min, x.Max = v, v, v, v
	x.Measured, x.Met = true, v <= x.Target
	return x
}

// reps lists the repetition numbers present in the results.
func (r *Report) reps() []int {
	var reps []int
	for _, x := range r.Results {
		if !slices.Contains(reps, x.Rep) {
			reps = append(reps, x.Rep)
		}
	}
	slices.Sort(reps)
	return reps
}

// result finds one repetition of one cell.
func (r *Report) result(w, target, shape string, n, rep int) (Result, bool) {
	for _, x := range r.Results {
		if x.Workload == w && x.Target == target && x.Shape == shape && x.Rep == rep &&
			((shape == ShapeRate && x.Sandboxes == n) || (shape == ShapeClosed && x.Concurrency == n)) {
			return x, true
		}
	}
	return Result{}, false
}

// ratiosOf evaluates the targets with the run's own options.
func (r *Report) ratiosOf() []Ratio {
	mainN, _ := r.Options["sandboxes"].(int)
	conc, _ := r.Options["concurrency"].([]int)
	return r.Ratios(mainN, conc)
}

// ratioTable renders the targets this run measured, each with the floor it is judged against
// and the peers' figures for the same measure beside it, then names those it did not measure.
func (r *Report) ratioTable() string {
	var b strings.Builder
	b.WriteString("\n## Targets\n\n" +
		"Sandgate's figure against its floor's, measured in the same run, interleaved: the ratio is the median of " +
		"the per-repetition ratios (min–max beside it) and decides the status. The peers' figures for the same " +
		"measure are beside them. ⚠: a cell of the ratio had the load generator above 90% of a core.\n\n" +
		"| workload | measure | Sandgate | floor | peers | ratio (min–max) | target | status |\n" +
		"| --- | --- | ---: | --- | --- | ---: | ---: | --- |\n")
	var missing []string
	for _, x := range r.ratiosOf() {
		if !x.Measured {
			missing = append(missing, x.Workload+" "+x.Measure)
			continue
		}
		warn := ""
		if x.LoadgenSaturated {
			warn = " ⚠"
		}
		floor := fmt.Sprintf("%s %s", x.Floor, figure(x.FloorVal))
		if x.Floor == absolute {
			floor = "—"
		}
		value := fmt.Sprintf("%.2f× (%.2f–%.2f)", x.Ratio, x.Min, x.Max)
		if x.Difference {
			value = fmt.Sprintf("%+.2f ms (%+.2f–%+.2f)", x.Ratio, x.Min, x.Max)
		} else if x.Floor == absolute {
			value = "—"
		}
		measure := x.Measure
		if x.Note != "" {
			measure += " (" + x.Note + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s%s | %s | %s |\n", x.Workload, measure, figure(x.Sandgate), floor,
			peersText(x.Peers), value, warn, x.TargetText(), verdict(x.Met))
	}
	if len(missing) > 0 {
		fmt.Fprintf(&b, "\nNot measured in this run (their cells were not run, or gave no figure to compare): %s.\n", strings.Join(missing, "; "))
	}
	if ab := r.ABRatios(); len(ab) > 0 {
		b.WriteString("\n## A/B: this build against the baseline binary (same run, interleaved)\n\n" +
			"| workload | measure | this build | baseline | ratio (median) | min–max |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
		for _, x := range ab {
			fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %.3f× | %.3f–%.3f |\n", x.Workload, x.Measure, x.Sandgate, x.FloorVal, x.Ratio, x.Min, x.Max)
		}
	}
	return b.String()
}

// figure writes a measured value with the precision its size calls for.
func figure(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// peersText writes the peers' figures, "squid 40.1, tinyproxy 55.0", or "—".
func peersText(peers map[string]float64) string {
	var parts []string
	for _, p := range peerNames {
		if v, ok := peers[p]; ok {
			parts = append(parts, p+" "+figure(v))
		}
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, ", ")
}

// ABRatios set the sandgate target against the baseline binary (Options.BaselineBin), per
// repetition: CPU per request at every closed-loop concurrency, and the process's RSS at the
// end of each fixed-rate cell (the memory a change to per-connection state moves). Below 1 the
// change is cheaper.
func (r *Report) ABRatios() []Ratio {
	var out []Ratio
	conc, _ := r.Options["concurrency"].([]int)
	counts, _ := r.Options["sweep"].([]int)
	if mainN, _ := r.Options["sandboxes"].(int); !slices.Contains(counts, mainN) {
		counts = append(counts, mainN)
	}
	cpu := func(x Result) float64 { return x.CPUPerReqUS }
	rss := func(x Result) float64 { return float64(x.RSSBytes) / (1 << 20) }
	for _, w := range AllWorkloads {
		for _, c := range conc {
			if x, ok := r.abRatio(w, "sandgate", "baseline", ShapeClosed, c, fmt.Sprintf("CPU µs/request (c=%d)", c), cpu); ok {
				out = append(out, x)
			}
			if x, ok := r.abRatio(w, "otlp", "otlp-baseline", ShapeClosed, c, fmt.Sprintf("CPU µs/request (c=%d), audit OTLP export on", c), cpu); ok {
				out = append(out, x)
			}
			if x, ok := r.abRatio(w, "minted", "minted-baseline", ShapeClosed, c, fmt.Sprintf("CPU µs/request (c=%d), minted credential", c), cpu); ok {
				out = append(out, x)
			}
		}
		for _, n := range counts {
			if x, ok := r.abRatio(w, "sandgate", "baseline", ShapeRate, n, fmt.Sprintf("RSS MB at the end of the fixed-rate cell, %d sandboxes", n), rss); ok {
				out = append(out, x)
			}
		}
	}
	return out
}

// abRatio is target over its baseline for one cell's value f, median and range over
// repetitions.
func (r *Report) abRatio(w, target, baseline, shape string, n int, measure string, f func(Result) float64) (Ratio, bool) {
	x := Ratio{Workload: w, Measure: measure, Floor: baseline}
	var a, b []float64
	for _, rep := range r.reps() {
		sg, ok1 := r.result(w, target, shape, n, rep)
		bl, ok2 := r.result(w, baseline, shape, n, rep)
		if ok1 && ok2 && f(sg) > 0 && f(bl) > 0 {
			a, b = append(a, f(sg)), append(b, f(bl))
			x.PerRep = append(x.PerRep, f(sg)/f(bl))
		}
	}
	if len(x.PerRep) == 0 {
		return x, false
	}
	x.Measured, x.Sandgate, x.FloorVal, x.Ratio = true, median(a), median(b), median(x.PerRep)
	x.Min, x.Max = slices.Min(x.PerRep), slices.Max(x.PerRep)
	return x, true
}
