// Command sandbench runs the Sandgate benchmark: N simulated sandboxes (each its own loopback
// source address) against Sandgate and its peers, interleaved, and writes the report to
// var/bench/ (ignored by git), or with -publish to bench/results/. `make bench` builds the
// binaries and runs it; see bench/README.md.
//
//	sandbench [-quick] [-sandboxes 1000] [-sweep 100,1000] [-rate 2000] [-reps 2] ...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/bench"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-serve-upstreams" {
		serveUpstreams(os.Args[2])
		return
	}
	o := bench.Options{}
	quick := flag.Bool("quick", false, "a short run (about a minute): 1 repetition, 1 s windows, 200 sandboxes")
	flag.StringVar(&o.SandgateBin, "sandgate", "bin/sandgate", "sandgate binary (make build)")
	flag.StringVar(&o.BaselineBin, "baseline", "", "a second sandgate binary (e.g. main's build) measured beside -sandgate, interleaved: the A/B of a change")
	baselineOmit := flag.String("baseline-omit", "", "top-level config keys (comma-separated) left out of the baseline's config, for a binary older than them (e.g. shutdown, before 1ab4960), and out of the sandgate target's, so that both run one config and may swap places")
	flag.StringVar(&o.RelayBin, "relay", "bin/bench-relay", "bare CONNECT relay binary (bench/cmd/relay)")
	flag.StringVar(&o.SmokescreenBin, "smokescreen", ".tools/bin/smokescreen", "Stripe's Smokescreen (make setup installs it), a peer on tunnel, tunnel-new and forward")
	flag.StringVar(&o.PolicyDir, "policies", "policies", "the shipped policies (their rules; the bench brings its own data)")
	flag.StringVar(&o.OutDir, "out", "", "results folder: the report, its ratio JSON and charts (default "+bench.OutDir+", ignored by git; with -publish "+bench.PublishedDir+")")
	flag.BoolVar(&o.Publish, "publish", false, "write the report into "+bench.PublishedDir+" (the reports the repository keeps) and rewrite its index and latest.json")
	flag.StringVar(&o.RawDir, "raw-out", bench.RawDir, "folder of the raw dump of every cell (not committed)")
	fromRaw := flag.String("from-raw", "", "write the report of a raw dump (RAW/LABEL.json: LABEL.md, LABEL.json, the charts) into -out, and stop")
	flag.IntVar(&o.Sandboxes, "sandboxes", 1000, "sandboxes of the main fixed-rate runs (10000: the 10k-sandbox run)")
	sweep := flag.String("sweep", "100,1000", "sandbox counts of the latency-vs-sandboxes chart (route, intercept, mcp); -sandboxes is added")
	flag.Float64Var(&o.Rate, "rate", 500, "offered requests/s of the fixed-rate shape, spread over the sandboxes (2000 saturates Sandgate on a loaded 2-core box)")
	conc := flag.String("concurrency", "64,512", "closed-loop client counts")
	flag.IntVar(&o.Reps, "reps", 3, "interleaved repetitions (ratios: median and min–max over them)")
	flag.DurationVar(&o.RateDuration, "rate-duration", 3*time.Second, "window of a fixed-rate cell")
	flag.DurationVar(&o.TailDuration, "tail-duration", 10*time.Second, "window of the fixed-rate cells whose latency a target reads (route, intercept, mcp at -sandboxes); 0: -rate-duration")
	flag.DurationVar(&o.ClosedDuration, "closed-duration", 2*time.Second, "window of a closed-loop cell")
	flag.DurationVar(&o.Warmup, "warmup", 500*time.Millisecond, "load before each window")
	flag.DurationVar(&o.Slice, "slice", 500*time.Millisecond, "closed-loop cells of one slot (same workload and clients, one per target) take turns every slice of this length within their window (A B C C B A …); 0: each cell's whole window in turn")
	flag.DurationVar(&o.Timeout, "timeout", 5*time.Second, "per-request timeout")
	workloads := flag.String("workloads", "", "comma-separated subset of "+strings.Join(bench.AllWorkloads, ",")+
		`; "declog": only route and mcp, with -policy-variants; "delivery": route, intercept and mcp, with -delivery-variants; "otlp": only route and mcp, with -export-variants; "minted": only route, with -credential-variants`)
	flag.BoolVar(&o.PolicyVariants, "policy-variants", false, `also run Sandgate with the decision log on ("declog") and with a shadow policy ("shadow"), interleaved, on route and mcp`)
	flag.BoolVar(&o.DeliveryVariants, "delivery-variants", false, `also run Sandgate with audit.delivery: async ("async") beside the default blocking one, interleaved, on route, intercept and mcp`)
	flag.BoolVar(&o.CredentialVariants, "credential-variants", false, `also run Sandgate with the route's credential minted per sandbox run ("minted", OAuth 2.0 client credentials at the stand-ins' token endpoint), interleaved, on route`)
	flag.BoolVar(&o.ExportVariants, "export-variants", false, `also run Sandgate exporting its audit log over OTLP to a Collector ("otlp"), interleaved, on route and mcp`)
	flag.StringVar(&o.OtelcolBin, "otelcol", ".tools/bin/otelcol", "the OpenTelemetry Collector test/setup.sh builds (test/otelcol), for -export-variants")
	flag.StringVar(&o.Label, "label", "", "report file name stem (default DATE-SHORTSHA)")
	flag.Parse()
	o.OutDir = outDir(o)
	if *fromRaw != "" {
		os.Exit(renderFromRaw(*fromRaw, o.OutDir, o.Publish))
	}
	if *quick {
		quickRun(&o, sweep)
	}
	var err error
	if o.Sweep, err = ints(*sweep); err == nil {
		o.Concurrency, err = ints(*conc)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbench:", err)
		os.Exit(2)
	}
	if !containsInt(o.Sweep, o.Sandboxes) {
		o.Sweep = append(o.Sweep, o.Sandboxes)
	}
	if *baselineOmit != "" {
		o.BaselineOmit = strings.Split(*baselineOmit, ",")
	}
	o.Workloads = workloadList(&o, *workloads)
	if o.Label == "" {
		o.Label = time.Now().UTC().Format("2006-01-02") + "-" + shortSHA()
	}
	o.Progress = func(s string) { fmt.Fprintln(os.Stderr, s) }
	if exe, err := os.Executable(); err == nil {
		o.UpstreamsExe = exe
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *replicasOnly {
		os.Exit(runReplicas(ctx, o))
	}
	rep, err := bench.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbench:", err)
		os.Exit(1)
	}
	printSummary(rep, o)
}

// outDir is -out, else var/bench, or with -publish bench/results.
func outDir(o bench.Options) string {
	switch {
	case o.OutDir != "":
		return o.OutDir
	case o.Publish:
		return bench.PublishedDir
	}
	return bench.OutDir
}

// peers writes the peers' figures beside a target's: "  (squid 40.10, tinyproxy 55.00)".
func peers(vs map[string]float64) string {
	var parts []string
	for _, p := range []string{"squid", "tinyproxy", "smokescreen"} {
		if v, ok := vs[p]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", p, v))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "  (" + strings.Join(parts, ", ") + ")"
}

// renderFromRaw writes the report of a raw dump (RAW/LABEL.json, or a report's JSON from before
// issue 38) into out, drawn by this code: a kept report made again without its run.
func renderFromRaw(raw, out string, publish bool) int {
	rep, err := bench.ReadRaw(raw)
	if err == nil {
		err = rep.WriteReport(out, strings.TrimSuffix(filepath.Base(raw), ".json"), publish)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandbench -from-raw:", err)
		return 1
	}
	return 0
}

// printSummary prints where the report is, the ratio targets this run measured, with the
// floor's and the peers' figures, the A/B of this run (with -baseline), the other checks it
// made and the targets it skipped, with why.
func printSummary(rep *bench.Report, o bench.Options) {
	fmt.Printf("report: %s/%s.md\n", o.OutDir, o.Label)
	defer func() {
		for _, c := range rep.Checks(o.Sandboxes) {
			if c.Status != "not measured" {
				fmt.Printf("  %-6s %s: %s\n", strings.Trim(c.Status, "*"), c.Target, c.Value)
			}
		}
		for _, s := range rep.Skipped {
			fmt.Printf("  skipped %s: %s\n", s.Target, s.Why)
		}
	}()
	fmt.Printf("targets (Sandgate against its floor in this run; ratio: median and min–max over %d repetitions):\n", o.Reps)
	notMeasured := 0
	for _, x := range rep.Ratios(o.Sandboxes, o.Concurrency) {
		if !x.Measured {
			notMeasured++
			continue
		}
		status := "missed"
		if x.Met {
			status = "met"
		}
		value := fmt.Sprintf("ratio %6.2f (%.2f–%.2f)", x.Ratio, x.Min, x.Max)
		if x.Difference {
			value = fmt.Sprintf("difference %+.2f ms (%+.2f–%+.2f)", x.Ratio, x.Min, x.Max)
		}
		fmt.Printf("  %-6s %-10s %-60s Sandgate %8.2f  %s %8.2f  %s  target %s%s\n", status, x.Workload, x.Measure,
			x.Sandgate, x.Floor, x.FloorVal, value, x.TargetText(), peers(x.Peers))
	}
	if notMeasured > 0 {
		fmt.Printf("  (%d more targets not measured in this run: the report lists them)\n", notMeasured)
	}
	if o.BaselineBin != "" {
		fmt.Printf("A/B (sandgate over baseline, median and min–max over repetitions):\n")
		for _, x := range rep.ABRatios() {
			fmt.Printf("  %-10s %-40s %6.3f (%.3f–%.3f)\n", x.Workload, x.Measure, x.Ratio, x.Min, x.Max)
		}
	}
}

// serveUpstreams is the upstream stand-ins' own process (bench.ServeUpstreams), which a run
// starts as `sandbench -serve-upstreams DIR` and stops with SIGTERM.
func serveUpstreams(dir string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.ServeUpstreams(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, "sandbench -serve-upstreams:", err)
		os.Exit(1)
	}
}

// quickRun applies -quick: 1 s windows (tail windows too), and 1 repetition, 200 sandboxes and
// a sweep of 50 unless those flags are given.
func quickRun(o *bench.Options, sweep *string) {
	o.RateDuration, o.TailDuration, o.ClosedDuration, o.Warmup = time.Second, time.Second, time.Second, 200*time.Millisecond
	if !isSet("reps") {
		o.Reps = 1
	}
	if !isSet("sandboxes") {
		o.Sandboxes = 200
	}
	if !isSet("sweep") {
		*sweep = "50"
	}
}

func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func containsInt(xs []int, v int) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

func shortSHA() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "nogit"
	}
	return strings.TrimSpace(string(out))
}

// workloadList is -workloads as a list; a variant's name ("declog", "delivery", "otlp") stands
// for the workloads that variant's targets serve (route and mcp; intercept too for delivery),
// with those targets on.
func workloadList(o *bench.Options, workloads string) []string {
	switch workloads {
	case "declog":
		workloads, o.PolicyVariants = bench.WRoute+","+bench.WMCP, true
	case "delivery":
		workloads, o.DeliveryVariants = bench.WRoute+","+bench.WIntercept+","+bench.WMCP, true
	case "otlp":
		workloads, o.ExportVariants = bench.WRoute+","+bench.WMCP, true
	case "minted":
		workloads, o.CredentialVariants = bench.WRoute, true
	}
	if workloads == "" {
		return o.Workloads
	}
	return strings.Split(workloads, ",")
}
