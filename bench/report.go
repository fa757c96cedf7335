package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
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
	Skipped  []Skip            `json:"skipped,omitempty"` // targets not measured, and why
	Rows     []Row             `json:"rows"`
	Policy   []PolicyFigure    `json:"policy_decision,omitempty"`
	Results  []Result          `json:"results"`
}

func buildReport(o Options, results []Result, notes []string) *Report {
	r := &Report{Time: time.Now().UTC(), Label: o.Label, Notes: notes, Results: results, Machine: machine(),
		Options: map[string]any{"sandboxes": o.Sandboxes, "sweep": o.Sweep, "rate": o.Rate, "concurrency": o.Concurrency,
			"reps": o.Reps, "rate_duration": o.RateDuration.String(), "tail_duration": o.TailDuration.String(), "closed_duration": o.ClosedDuration.String(), "warmup": o.Warmup.String(), "slice": o.Slice.String()}}
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

// peerVersions are the versions of the peers this run measured, and of no other.
func peerVersions(targets []*Target) map[string]string {
	v := map[string]string{}
	for _, t := range targets {
		switch t.Name {
		case "squid":
			if out, err := exec.Command("squid", "-v").Output(); err == nil {
				v["squid"] = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
			}
		case "tinyproxy":
			if out, err := exec.Command("tinyproxy", "-v").CombinedOutput(); err == nil {
				v["tinyproxy"] = strings.TrimSpace(string(out))
			}
		case "smokescreen":
			v["smokescreen"] = "smokescreen " + smokescreenVersion
		}
	}
	return v
}
