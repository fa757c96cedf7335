package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Row is the median over repetitions of one cell, with latency added over direct.
type Row struct {
	Result
	Reps         int     `json:"reps"`
	AddedP50MS   float64 `json:"added_p50_ms"`
	AddedP90MS   float64 `json:"added_p90_ms"`
	AddedP99MS   float64 `json:"added_p99_ms"`
	RSSPerSBKB   float64 `json:"rss_kb_per_sandbox,omitempty"`
	HasDirect    bool    `json:"-"`
	ErrorSamples string  `json:"-"`
}

// Report is a whole run.
type Report struct {
	Time     time.Time         `json:"time"`
	Label    string            `json:"label"`
	Options  map[string]any    `json:"options"`
	Machine  map[string]string `json:"machine"`
	Versions map[string]string `json:"versions"`
	Notes    []string          `json:"notes"`
	Rows     []Row             `json:"rows"`
	Policy   []PolicyFigure    `json:"policy_decision,omitempty"`
	Results  []Result          `json:"results"`
}

func buildReport(o Options, results []Result, notes []string) *Report {
	r := &Report{Time: time.Now().UTC(), Label: o.Label, Notes: notes, Results: results, Machine: machine(),
		Options: map[string]any{"sandboxes": o.Sandboxes, "sweep": o.Sweep, "rate": o.Rate, "concurrency": o.Concurrency,
			"reps": o.Reps, "rate_duration": o.RateDuration.String(), "tail_duration": o.TailDuration.String(), "closed_duration": o.ClosedDuration.String(), "warmup": o.Warmup.String()}}
	groups := map[Cell][]Result{}
	var order []Cell
	for _, res := range results {
		if _, ok := groups[res.Cell]; !ok {
			order = append(order, res.Cell)
		}
		groups[res.Cell] = append(groups[res.Cell], res)
	}
	rows := map[Cell]*Row{}
	for _, c := range order {
		g := groups[c]
		pick := func(f func(Result) float64) float64 {
			xs := make([]float64, len(g))
			for i, x := range g {
				xs[i] = f(x)
			}
			return median(xs)
		}
		row := &Row{Result: Result{Cell: c}, Reps: len(g)}
		m := &row.Result
		m.Throughput = pick(func(x Result) float64 { return x.Throughput })
		m.P50MS = pick(func(x Result) float64 { return x.P50MS })
		m.P90MS = pick(func(x Result) float64 { return x.P90MS })
		m.P99MS = pick(func(x Result) float64 { return x.P99MS })
		m.CPUPerReqUS = pick(func(x Result) float64 { return x.CPUPerReqUS })
		m.UpstreamCPUPerReqUS = pick(func(x Result) float64 { return x.UpstreamCPUPerReqUS })

		m.RSSBytes = int64(pick(func(x Result) float64 { return float64(x.RSSBytes) }))
		m.Files = int(pick(func(x Result) float64 { return float64(x.Files) }))
		m.Threads = int(pick(func(x Result) float64 { return float64(x.Threads) }))
		m.Goroutines = int(pick(func(x Result) float64 { return float64(x.Goroutines) }))
		m.UpstreamOpened = int64(pick(func(x Result) float64 { return float64(x.UpstreamOpened) }))
		m.TLSHandshakes = int64(pick(func(x Result) float64 { return float64(x.TLSHandshakes) }))
		for _, x := range g {
			m.Requests += x.Requests
			m.Errors += x.Errors
			m.PeakRSSBytes = max(m.PeakRSSBytes, x.PeakRSSBytes)
			m.LoadgenCores = max(m.LoadgenCores, x.LoadgenCores) // the worst repetition flags the row
			m.UpstreamPeak = max(m.UpstreamPeak, x.UpstreamPeak)
			if m.FirstError == "" {
				m.FirstError = x.FirstError
			}
		}
		if c.Target == "sandgate" && c.Shape == ShapeRate && c.Sandboxes > 0 {
			row.RSSPerSBKB = float64(m.RSSBytes) / 1024 / float64(c.Sandboxes)
		}
		rows[c] = row
	}
	for _, c := range order {
		row := rows[c]
		d := c
		d.Target = "direct"
		if dr, ok := rows[d]; ok && c.Target != "direct" {
			row.HasDirect = true
			row.AddedP50MS = row.P50MS - dr.P50MS
			row.AddedP90MS = row.P90MS - dr.P90MS
			row.AddedP99MS = row.P99MS - dr.P99MS
		}
		r.Rows = append(r.Rows, *row)
	}
	return r
}

func machine() map[string]string {
	m := map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m["loadavg_at_end"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return m
}

func peerVersions() map[string]string {
	v := map[string]string{}
	if out, err := exec.Command("squid", "-v").Output(); err == nil {
		v["squid"] = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	if out, err := exec.Command("tinyproxy", "-v").CombinedOutput(); err == nil {
		v["tinyproxy"] = strings.TrimSpace(string(out))
	}
	return v
}

// Write saves LABEL.md, LABEL.json and LABEL-latency-vs-sandboxes.png under dir and points
// dir/README.md at them.
func (r *Report) Write(dir, label string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results dir: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	png := label + "-latency-vs-sandboxes.png"
	if err := writeChart(filepath.Join(dir, png), r); err != nil {
		return err
	}
	md := r.Markdown(png)
	for name, b := range map[string][]byte{label + ".json": js, label + ".md": []byte(md)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	latest, err := json.MarshalIndent(struct {
		Label   string            `json:"label"`
		Time    time.Time         `json:"time"`
		Report  string            `json:"report"`
		Machine map[string]string `json:"machine"`
		Ratios  []Ratio           `json:"ratios"`
	}{label, r.Time, label + ".md", r.Machine, r.ratiosOf()}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode latest.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.json"), latest, 0o644); err != nil {
		return fmt.Errorf("write latest.json: %w", err)
	}
	return writeResultsIndex(dir, label)
}

// reportTime is when the run of report label started: the time in LABEL.json, else the date
// its label starts with (a -replicas report has no JSON), else the zero time.
func reportTime(dir, label string) time.Time {
	if raw, err := os.ReadFile(filepath.Join(dir, label+".json")); err == nil {
		var r struct {
			Time time.Time `json:"time"`
		}
		if json.Unmarshal(raw, &r) == nil && !r.Time.IsZero() {
			return r.Time
		}
	}
	if len(label) >= len(time.DateOnly) {
		if t, err := time.Parse(time.DateOnly, label[:len(time.DateOnly)]); err == nil {
			return t
		}
	}
	return time.Time{}
}

// writeResultsIndex lists the reports kept in dir, newest first, in dir/README.md. What is kept
// is a choice made at commit time (bench/README.md "Reports"): the newest report, and one per
// landed change that moved a ratio; older runs live in git history, and dir/HISTORY.md (written
// by hand, when there is one) says where to find those the docs cite.
func writeResultsIndex(dir, latest string) error {
	const historyFile = "HISTORY"
	mds, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return err
	}
	var labels []string
	when := map[string]time.Time{}
	for _, m := range mds {
		if l := strings.TrimSuffix(filepath.Base(m), ".md"); l != "README" && l != historyFile {
			labels = append(labels, l)
			when[l] = reportTime(dir, l)
		}
	}
	// A label's commit hash says nothing of order: two reports of one day sort by the time
	// their run started.
	slices.SortFunc(labels, func(a, b string) int {
		if c := when[b].Compare(when[a]); c != 0 {
			return c
		}
		return strings.Compare(b, a)
	})
	var b strings.Builder
	fmt.Fprintf(&b, "# Bench results\n\n`make bench` writes one report per run here: LABEL.md, LABEL.json (every cell and "+
		"repetition), LABEL-latency-vs-sandboxes.png, and latest.json (the ratio targets of the newest run, machine-readable). "+
		"Keep the newest report and one per landed change that moved a ratio; delete the rest before committing (git keeps them).\n\n"+
		"Latest: [%s.md](%s.md) ([targets](latest.json))\n\n", latest, latest)
	if _, err := os.Stat(filepath.Join(dir, historyFile+".md")); err == nil {
		fmt.Fprintf(&b, "Earlier reports the docs cite, kept in git: [%s.md](%s.md).\n\n", historyFile, historyFile)
	}
	b.WriteString("| report | JSON | chart |\n| --- | --- | --- |\n")
	for _, l := range labels {
		if strings.HasSuffix(l, "-replicas") { // sandbench -replicas: Markdown only
			fmt.Fprintf(&b, "| [%s](%s.md) | — | — |\n", l, l)
			continue
		}
		fmt.Fprintf(&b, "| [%s](%s.md) | [json](%s.json) | [png](%s-latency-vs-sandboxes.png) |\n", l, l, l, l)
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(b.String()), 0o644)
}
