package bench

import (
	"context"
	"crypto/x509"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Options configure a run. Every duration is bounded: a run stops by itself.
type Options struct {
	SandgateBin string // the `make build` binary
	// BaselineBin, when set, is a second Sandgate binary (an older commit's build) measured as
	// target "baseline" beside "sandgate", interleaved, on the same config: the A/B figure a
	// speed change cites (Report.ABTable).
	BaselineBin string
	// BaselineOmit are top-level config keys left out of the baseline's config: a binary older
	// than a field the bench sets (shutdown, for builds before 1ab4960) refuses the whole file.
	// They are left out of "sandgate"'s too, so that the A/B compares one config, and either
	// binary can take either place (a crossover run, to cancel the places' own difference).
	BaselineOmit []string
	// PolicyVariants adds two more Sandgates beside "sandgate", same binary and config plus one
	// policy feature, measured interleaved on the route and mcp workloads: "declog" with
	// policy.decision_log on, "shadow" with a shadow policy (the same policies). Their ratios to
	// "sandgate" are issue #21's cost targets (ratioSpecs).
	PolicyVariants bool
	// DeliveryVariants adds a Sandgate with audit.delivery: async ("async") beside "sandgate"
	// (blocking, the default), interleaved on route, intercept and mcp: the cost of holding an answer's
	// end for its event (issue #36; ratioSpecs and deliveryP50).
	DeliveryVariants bool
	// ExportVariants adds "otlp" beside "sandgate": the same binary and config with the audit log
	// exported over OTLP (audit.otlp) to a Collector (OtelcolBin, test/otelcol's build) in a
	// process of its own, measured interleaved on route and mcp: issue #37's cost target.
	ExportVariants bool
	// CredentialVariants adds "minted" beside "sandgate": the route's credential minted per
	// sandbox run (OAuth 2.0 client credentials at the stand-ins' token endpoint) instead of a
	// static key, measured interleaved on route: issue #57's cost target. With BaselineBin,
	// the baseline binary is measured so too ("minted-baseline"): the A/B of a change to it.
	CredentialVariants bool
	OtelcolBin         string
	RelayBin           string // bench/cmd/relay
	SmokescreenBin     string // Stripe's Smokescreen, from the tools cache (make setup)
	PolicyDir          string // the shipped policies (their rules; the bench supplies its own data)
	// OutDir is where the report goes: var/bench (ignored by git), or with Publish
	// bench/results, where the index and latest.json are rewritten too.
	OutDir  string
	Publish bool
	RawDir  string // the raw dump's folder, ignored by git (RawDir)
	Label   string // file name stem, e.g. 2026-11-29-34b6d5e

	Sandboxes      int           // sandboxes of the main fixed-rate runs
	Sweep          []int         // sandbox counts for the latency-vs-sandboxes chart
	Rate           float64       // offered requests/s of the fixed-rate shape
	Concurrency    []int         // closed-loop client counts
	Reps           int           // interleaved repetitions; medians are reported
	RateDuration   time.Duration // measurement window of a fixed-rate cell
	ClosedDuration time.Duration // measurement window of a closed-loop cell
	// TailDuration is the window of the fixed-rate cells whose latency a target reads (the
	// added p99 and shadow p50 ratios: Sandboxes, route/intercept/mcp); 0 uses RateDuration.
	TailDuration time.Duration
	Warmup       time.Duration // load before each window (after every sandbox connected)
	// Slice, when set, measures the closed-loop cells of a slot together, the targets taking
	// turns every Slice within the window (runSliced): what a target costs against another,
	// without the seconds-long drifts of a shared machine between them.
	Slice     time.Duration
	Timeout   time.Duration // per request
	Workloads []string      // subset to run (default all)
	Progress  func(string)
	// UpstreamsExe serves the upstream stand-ins in a process of their own
	// (`UpstreamsExe -serve-upstreams DIR`, see ServeUpstreams); empty serves them in this one.
	UpstreamsExe string
}

// startMoreSandgates starts the Sandgates measured beside "sandgate": the baseline binary
// (Options.BaselineBin), the policy variants (Options.PolicyVariants) and the export variant
// (Options.ExportVariants). On an error it stops those it started.
func startMoreSandgates(ctx context.Context, o Options, root string, up *Upstreams, maxN int) ([]*Target, error) {
	type sandgate struct {
		bin string
		variant
	}
	var want []sandgate
	if o.BaselineBin != "" {
		want = append(want, sandgate{o.BaselineBin, variant{name: "baseline", omit: o.BaselineOmit}})
	}
	if o.PolicyVariants {
		for _, v := range policyVariants {
			want = append(want, sandgate{o.SandgateBin, v})
		}
	}
	if o.DeliveryVariants {
		want = append(want, sandgate{o.SandgateBin, asyncDelivery})
	}
	if o.CredentialVariants {
		v := mintedVariant
		v.credentials = fmt.Sprintf(v.credentials, "http://"+up.HTTPAddr+tokenPath)
		want = append(want, sandgate{o.SandgateBin, v})
		// With a baseline, its minted credential is measured too ("minted-baseline"): the A/B
		// of a change to what a minted credential costs (the guard's needles of a run).
		if o.BaselineBin != "" {
			v.name, v.omit = "minted-baseline", o.BaselineOmit
			want = append(want, sandgate{o.BaselineBin, v})
		}
	}
	var started []*Target
	stopAll := func() {
		for _, t := range started {
			t.Stop()
		}
	}
	for _, w := range want {
		t, err := retryBind(func() (*Target, error) {
			return startSandgate(ctx, w.name, w.bin, filepath.Join(root, w.name), o.PolicyDir, up, maxN, w.variant)
		})
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("%s: %w", w.name, err)
		}
		started = append(started, t)
	}
	if o.ExportVariants {
		// With a baseline, its export is measured too ("otlp-baseline", a Collector of its own):
		// the A/B of a change to the exporter.
		bins := map[string]string{exportVariant.name: o.SandgateBin}
		if o.BaselineBin != "" {
			bins[exportVariant.name+"-baseline"] = o.BaselineBin
		}
		for name, bin := range bins {
			t, err := startExportVariant(ctx, o, root, up, maxN, name, bin)
			if err != nil {
				stopAll()
				return nil, err
			}
			started = append(started, t)
		}
	}
	return started, nil
}

// startExportVariant starts a Collector and the Sandgate (bin, as target name) exporting its
// audit log to it; the Collector stops with the target.
func startExportVariant(ctx context.Context, o Options, root string, up *Upstreams, maxN int, name, bin string) (*Target, error) {
	col, url, err := startCollector(ctx, o.OtelcolBin, filepath.Join(root, "otelcol-"+name))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	v := exportVariant
	v.name = name
	v.audit = fmt.Sprintf(v.audit, url)
	t, err := retryBind(func() (*Target, error) {
		return startSandgate(ctx, v.name, bin, filepath.Join(root, v.name), o.PolicyDir, up, maxN, v)
	})
	if err != nil {
		col.Stop(5 * time.Second)
		return nil, fmt.Errorf("%s: %w", v.name, err)
	}
	t.companions = append(t.companions, col)
	return t, nil
}

// supports says which workloads a target can serve.
func supports(target, w string) bool {
	switch target {
	case "direct":
		return true
	case "sandgate", "baseline":
		// Plain forwarding exists, but its dial guard (rightly) refuses the loopback stand-in:
		// plain forward has no allow_private knob. The mix is every other workload.
		return w != WForward
	case "async":
		// Blocking delivery holds each answer's end until its event is written: intercepted
		// answers too.
		return w == WRoute || w == WMCP || w == WIntercept
	case "declog", "shadow", "otlp", "otlp-baseline":
		return w == WRoute || w == WMCP
	case "minted", "minted-baseline":
		return w == WRoute
	case "relay":
		// The bare CONNECT relay, a bare httputil.ReverseProxy for the route, and a bare mcp-go
		// server forwarding to an mcp-go client for MCP.
		return w == WTunnel || w == WTunnelNew || w == WRoute || w == WRouteConv || w == WMCP
	case "goproxy":
		// goproxy's own interception with nothing added: the floor of the intercept workload.
		return w == WIntercept
	case "squid", "tinyproxy", "smokescreen":
		return w == WTunnel || w == WTunnelNew || w == WForward
	}
	return false
}

// AllWorkloads in report order.
var AllWorkloads = []string{WRoute, WRouteConv, WIntercept, WMCP, WTunnel, WTunnelNew, WForward, WMix}

// sweepWorkloads are run at every sandbox count of the sweep (their charts: Sandgate, its floor
// and the peers at each count); the full matrix runs at Sandboxes only.
var sweepWorkloads = []string{WRoute, WIntercept, WMCP, WTunnel, WTunnelNew}

// tunnelSweepMax bounds the sweep of the tunnel workloads: a tunnel holds an upstream connection
// of its own, so 10,000 sandboxes are 20,000 open files in each peer and in the stand-ins, the
// hard limit of the bench machine.
const tunnelSweepMax = 1000

// swept reports whether workload w runs at sweep count n (besides the main count).
func swept(w string, n int) bool {
	if !slices.Contains(sweepWorkloads, w) {
		return false
	}
	return n <= tunnelSweepMax || (w != WTunnel && w != WTunnelNew)
}

// Run starts the upstreams and every target, runs the interleaved cells and writes the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := raiseFileLimit(262144); err != nil {
		o.Progress("warning: " + err.Error())
	}
	root, err := os.MkdirTemp("", "sandgate-bench-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o755); err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runCgroups = newCgroups()
	defer runCgroups.remove()
	var up *Upstreams
	skipped := o.dropUnavailable()
	if o.UpstreamsExe != "" {
		up, err = startUpstreamsProcess(ctx, o.UpstreamsExe, filepath.Join(root, "upstream-ca"))
	} else {
		up, err = StartUpstreams(ctx, filepath.Join(root, "upstream-ca"))
	}
	if err != nil {
		return nil, err
	}
	defer up.Stop()
	maxN := slices.Max(append([]int{o.Sandboxes}, o.Sweep...))
	maxN = max(maxN, slices.Max(o.Concurrency))
	targets := []*Target{{Name: "direct", MCPURL: up.MCPURL}}
	sg, err := retryBind(func() (*Target, error) {
		return startSandgate(ctx, "sandgate", o.SandgateBin, filepath.Join(root, "sandgate"), o.PolicyDir, up, maxN, variant{name: "sandgate", omit: o.BaselineOmit})
	})
	if err != nil {
		return nil, err
	}
	targets = append(targets, sg)
	more, err := startMoreSandgates(ctx, o, root, up, maxN)
	if err != nil {
		sg.Stop()
		return nil, err
	}
	targets = append(targets, more...)
	peers, peerSkips := startPeers(ctx, o, root, up)
	targets = append(targets, peers...)
	skipped = append(skipped, peerSkips...)
	announceTargets(o, targets, skipped)
	defer func() {
		for _, t := range targets {
			t.Stop()
		}
	}()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(up.CACertPEM())
	for _, t := range targets {
		roots.AppendCertsFromPEM(t.InterceptCA) // Sandgate's, and the baseline's when measured
	}
	rn := &runner{env: &clientEnv{up: up, roots: roots, timeout: o.Timeout}, warmup: o.Warmup, progress: o.Progress}

	results, err := rn.runPhases(ctx, o, targets)
	if err != nil {
		return nil, err
	}
	rep := buildReport(o, results, nil)
	rep.Skipped = skipped
	rep.Versions = peerVersions(targets)
	rep.Machine["cpu_source"] = string(sg.proc.meter.Source())
	o.Progress("policy decision benchmark (in process, about 10 s)")
	if rep.Policy, err = benchPolicy(ctx, o.PolicyDir); err != nil {
		return nil, err
	}
	if err := rep.Write(o.OutDir, o.RawDir, o.Label, o.Publish); err != nil {
		return nil, err
	}
	return rep, nil
}

// dropUnavailable turns off the variants whose tools are not installed, and says why.
func (o *Options) dropUnavailable() []Skip {
	if _, err := os.Stat(o.OtelcolBin); o.ExportVariants && err != nil {
		o.ExportVariants = false
		return []Skip{{exportVariant.name, "the OpenTelemetry Collector is not built (" + o.OtelcolBin + "): make setup builds it"}}
	}
	return nil
}

// startPeers starts the floors and peers measured beside Sandgate from what is installed (make
// setup installs the peers; the bench installs nothing). One that is not installed, or does not
// start, is skipped, with why.
func startPeers(ctx context.Context, o Options, root string, up *Upstreams) ([]*Target, []Skip) {
	var targets []*Target
	var skipped []Skip
	for _, p := range []struct {
		name    string
		missing func() string // why it cannot run here, or ""
		start   func() (*Target, error)
	}{
		{"relay", builtBy(o.RelayBin, "make bench builds it"), func() (*Target, error) { return startRelay(ctx, o.RelayBin, root, up) }},
		{"goproxy", builtBy(o.RelayBin, "make bench builds it"), func() (*Target, error) {
			return startGoproxy(ctx, o.RelayBin, root, filepath.Join(root, "sandgate", "ca"), up)
		}},
		{"squid", onPath("squid"), func() (*Target, error) { return startSquid(ctx, root) }},
		{"tinyproxy", onPath("tinyproxy"), func() (*Target, error) { return startTinyproxy(ctx, root) }},
		{"smokescreen", builtBy(o.SmokescreenBin, "make setup builds it"), func() (*Target, error) { return startSmokescreen(ctx, o.SmokescreenBin, root) }},
	} {
		if !slices.ContainsFunc(o.workloads(), func(w string) bool { return supports(p.name, w) }) {
			continue // this run's workloads have no cell for it
		}
		if why := p.missing(); why != "" {
			skipped = append(skipped, Skip{p.name, why})
			continue
		}
		t, err := retryBind(p.start)
		if err != nil {
			skipped = append(skipped, Skip{p.name, "did not start: " + err.Error()})
			continue
		}
		targets = append(targets, t)
	}
	return targets, skipped
}

// announceTargets says, before the first cell, what the run measures and what it skips.
func announceTargets(o Options, targets []*Target, skipped []Skip) {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name
	}
	o.Progress("targets: " + strings.Join(names, ", "))
	for _, s := range skipped {
		o.Progress(fmt.Sprintf("skipped: %s: %s", s.Target, s.Why))
	}
}

// workloads are the run's workloads (every one when none is named).
func (o Options) workloads() []string {
	if len(o.Workloads) == 0 {
		return AllWorkloads
	}
	return o.Workloads
}

// runPhases measures every cell of every phase, o.Reps times, interleaved within a phase.
func (rn *runner) runPhases(ctx context.Context, o Options, targets []*Target) ([]Result, error) {
	phases := planPhases(o, targets)
	var results []Result
	total := 0
	for _, cells := range phases {
		total += len(cells) * o.Reps
	}
	done := 0
	started := time.Now()
	for _, cells := range phases {
		for rep := range o.Reps {
			for _, slot := range slots(rotated(cells, rep)) {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				res, err := rn.runSlot(ctx, o, targets, slot, rep)
				if err != nil {
					return nil, err
				}
				for i, r := range res {
					results = append(results, r)
					done++
					o.Progress(fmt.Sprintf("[%3d/%d %5.0fs] rep %d %-48s %7.0f req/s  p50 %6.2fms p99 %7.2fms  err %d  cpu %6.1fµs/req",
						done, total, time.Since(started).Seconds(), rep+1, slot[i].String(), r.Throughput, r.P50MS, r.P99MS, r.Errors, r.CPUPerReqUS))
					if r.FirstError != "" {
						o.Progress("      first error: " + truncate(r.FirstError, 200))
					}
				}
			}
		}
	}
	return results, nil
}

// runSlot measures one repetition of a slot's cells (cells that differ only by target): with
// o.Slice, closed-loop cells take turns slice by slice (runSliced); else each runs its whole
// window in turn.
func (rn *runner) runSlot(ctx context.Context, o Options, targets []*Target, slot []Cell, rep int) ([]Result, error) {
	ts := make([]*Target, len(slot))
	for i, c := range slot {
		ts[i] = targetNamed(targets, c.Target)
	}
	if o.Slice > 0 && len(slot) > 1 && slot[0].Shape == ShapeClosed {
		return rn.runSliced(ctx, ts, slot, o.window(slot[0]), o.Slice, rep)
	}
	out := make([]Result, 0, len(slot))
	for i, c := range slot {
		res, err := rn.run(ctx, ts[i], c, o.window(c), rep)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c, err)
		}
		out = append(out, res)
	}
	return out, nil
}

// slots cuts a repetition's cells into runs of cells that differ only by target.
func slots(cells []Cell) [][]Cell {
	var out [][]Cell
	for i := 0; i < len(cells); {
		j := i + 1
		for j < len(cells) && sameSlot(cells[i], cells[j]) {
			j++
		}
		out = append(out, cells[i:j])
		i = j
	}
	return out
}

// window is cell c's measurement window. A fixed-rate cell whose p99 or p50 a target reads gets
// TailDuration: at 500 requests/s a 3 s window leaves 15 requests above the 99th percentile, and
// the floors' own p99 moved −23…+74% across repetitions; with 10 s windows it stayed within
// ±10% in a dedicated 5-repetition run, though not in full runs with the machine at load 4–6
// (bench/README.md, "Workloads and shapes").
// Only those cells get it, so a full run takes minutes longer, not twice as long.
func (o Options) window(c Cell) time.Duration {
	switch {
	case c.Shape == ShapeClosed:
		return o.ClosedDuration
	case o.TailDuration > 0 && c.Sandboxes == o.Sandboxes && readsRateCell(c.Workload):
		return o.TailDuration
	}
	return o.RateDuration
}

// retryBind retries a start that lost its free port to another process on this shared machine
// (ports are picked free, then bound by the child: another process can take one in between).
func retryBind(start func() (*Target, error)) (*Target, error) {
	var err error
	for range 5 {
		var t *Target
		if t, err = start(); err == nil || !strings.Contains(err.Error(), "address already in use") {
			return t, err
		}
	}
	return nil, err
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func targetNamed(ts []*Target, name string) *Target {
	for _, t := range ts {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// planPhases groups the cells by sandbox count, fewest first, and each group runs all its
// repetitions before the next. A Sandgate replica keeps every sandbox's MCP session and
// connection state, and the process lives through the whole run: run in workload order, a
// 1,000-sandbox cell of the second repetition would be measured with the 10,000 sessions of
// the first repetition's sweep in memory (240 MB of live heap instead of 30, and the garbage
// collector's pauses in its p99). Ascending phases keep every cell's state at its own count.
func planPhases(o Options, targets []*Target) [][]Cell {
	byCount := map[int][]Cell{}
	for _, c := range planCells(o, targets) {
		byCount[c.Sandboxes] = append(byCount[c.Sandboxes], c)
	}
	var phases [][]Cell
	for _, n := range slices.Sorted(maps.Keys(byCount)) {
		phases = append(phases, byCount[n])
	}
	return phases
}

// rotated is repetition rep's order of a phase's cells: in each run of cells that differ only by
// target, the targets start rep places further on, so that across repetitions each target
// is measured in each place of the run. A cell measured first after a target that loads the
// machine differently (the direct cell, say) would otherwise always carry that bias.
func rotated(cells []Cell, rep int) []Cell {
	out := make([]Cell, 0, len(cells))
	for _, run := range slots(cells) {
		k := rep % len(run)
		out = append(append(out, run[k:]...), run[:k]...)
	}
	return out
}

// sameSlot reports cells that differ only by target.
func sameSlot(a, b Cell) bool {
	a.Target = b.Target
	return a == b
}

// planCells lists one repetition's cells, interleaved: for each workload and shape, every
// target in turn (direct, sandgate, relay, squid, tinyproxy, smokescreen), so slow drifts of the machine's
// load hit every target alike.
func planCells(o Options, targets []*Target) []Cell {
	workloads := o.workloads()
	var cells []Cell
	add := func(w string, c Cell) {
		for _, t := range targets {
			if supports(t.Name, w) {
				c.Workload, c.Target = w, t.Name
				cells = append(cells, c)
			}
		}
	}
	for _, w := range workloads {
		add(w, Cell{Shape: ShapeRate, Sandboxes: o.Sandboxes, Rate: o.Rate})
		for _, c := range o.Concurrency {
			add(w, Cell{Shape: ShapeClosed, Sandboxes: c, Concurrency: c})
		}
		for _, n := range o.Sweep {
			if n != o.Sandboxes && swept(w, n) {
				add(w, Cell{Shape: ShapeRate, Sandboxes: n, Rate: o.Rate})
			}
		}
	}
	return cells
}
