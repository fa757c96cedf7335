package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The report's places. A run writes into OutDir (var/bench, which git ignores) and changes no
// tracked file; `-publish` writes into PublishedDir, the reports the repository keeps (the
// latest full report and one per release tag), and rewrites its index and latest.json. RawDir
// holds each run's raw dump (every cell of every repetition, about 12,000 lines for a full
// run), never committed: the report's figures are all in the Markdown and the ratio JSON, and
// git history keeps earlier reports (bench/results/HISTORY.md says how to get one back).
const (
	OutDir       = "var/bench"
	PublishedDir = "bench/results"
	RawDir       = "var/bench/raw"
)

// chartFile is the name of LABEL's chart: one panel per workload.
func chartFile(label string) string { return label + "-charts.png" }

// Write saves the report of a run: the raw dump as rawDir/LABEL.json, and the report
// (WriteReport) under dir.
func (r *Report) Write(dir, rawDir, label string, publish bool) error {
	if err := r.WriteRaw(rawDir, label); err != nil {
		return err
	}
	return r.WriteReport(dir, label, publish)
}

// WriteReport writes LABEL.md, LABEL.json (the ratio targets, the A/B and the checks, one line
// each) and LABEL-charts.png under dir. Published, dir also gets latest.json (this LABEL.json)
// and README.md, the index of the reports kept.
func (r *Report) WriteReport(dir, label string, publish bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results dir: %w", err)
	}
	if err := writeChart(filepath.Join(dir, chartFile(label)), r); err != nil {
		return err
	}
	ratios, err := r.RatioJSON(label)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, label+".json"), ratios, 0o644); err != nil {
		return fmt.Errorf("write %s.json: %w", label, err)
	}
	if err := os.WriteFile(filepath.Join(dir, label+".md"), []byte(r.Markdown(chartFile(label))), 0o644); err != nil {
		return fmt.Errorf("write report %s: %w", label, err)
	}
	if !publish {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.json"), ratios, 0o644); err != nil {
		return fmt.Errorf("publish report %s: %w", label, err)
	}
	return writeResultsIndex(dir, label)
}

// WriteRaw saves the whole report, every cell and repetition, as rawDir/LABEL.json.
func (r *Report) WriteRaw(rawDir, label string) error {
	if err := os.MkdirAll(rawDir, 0o755); err != nil {
		return fmt.Errorf("raw results dir: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(rawDir, label+".json"), js, 0o644); err != nil {
		return fmt.Errorf("write raw results: %w", err)
	}
	return nil
}

// ReadRaw reads a raw dump (WriteRaw's, or a LABEL.json of the reports before issue 38) back
// into a report whose options are typed as a run sets them.
func ReadRaw(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read raw results: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode raw results %s: %w", path, err)
	}
	for k, v := range r.Options {
		switch v := v.(type) {
		case float64:
			r.Options[k] = int(v)
		case []any:
			ints := make([]int, 0, len(v))
			for _, x := range v {
				if f, ok := x.(float64); ok {
					ints = append(ints, int(f))
				}
			}
			r.Options[k] = ints
		}
	}
	// HasDirect is not in the dump: a row has it when its cell was measured against direct too.
	direct := map[Cell]bool{}
	for _, row := range r.Rows {
		if row.Target == "direct" {
			direct[row.Cell] = true
		}
	}
	for i := range r.Rows {
		c := r.Rows[i].Cell
		c.Target = "direct"
		r.Rows[i].HasDirect = r.Rows[i].Target != "direct" && direct[c]
	}
	return &r, nil
}

// RatioJSON is the machine-readable summary of a run: when and where it ran, its options, the
// ratio targets, the A/B against a baseline binary and the checks, one object per line.
func (r *Report) RatioJSON(label string) ([]byte, error) {
	mainN, _ := r.Options["sandboxes"].(int)
	fields := []struct {
		name string
		v    any
		list bool
	}{
		{"label", label, false}, {"time", r.Time, false}, {"report", label + ".md", false},
		{"machine", r.Machine, false}, {"options", r.Options, false},
		{"ratios", r.ratiosOf(), true}, {"ab", r.ABRatios(), true}, {"checks", r.Checks(mainN), true},
	}
	var b bytes.Buffer
	b.WriteString("{\n")
	for i, f := range fields {
		fmt.Fprintf(&b, "  %q: ", f.name)
		if err := writeJSONValue(&b, f.v, f.list); err != nil {
			return nil, fmt.Errorf("encode %s: %w", f.name, err)
		}
		if i < len(fields)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

// writeJSONValue writes v on one line, or a list with one element per line.
func writeJSONValue(b *bytes.Buffer, v any, list bool) error {
	if !list {
		j, err := json.Marshal(v)
		b.Write(j)
		return err
	}
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(j, &elems); err != nil || len(elems) == 0 {
		b.WriteString("[]")
		return nil
	}
	b.WriteString("[\n")
	for i, e := range elems {
		b.WriteString("    ")
		b.Write(e)
		if i < len(elems)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("  ]")
	return nil
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
// is a choice made at commit time (bench/README.md "Reports"): the latest full report and one
// per release tag; older runs live in git history, and dir/HISTORY.md (written by hand, when
// there is one) says how to get one back.
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
	fmt.Fprintf(&b, "# Bench results\n\nThe reports the repository keeps: the latest full report and one per release tag. "+
		"`make bench` writes a run's report to %s/, which git ignores; `make bench BENCH_FLAGS=-publish` writes it here "+
		"(LABEL.md, LABEL.json: the ratio targets and checks, machine-readable, LABEL-charts.png) and rewrites this index "+
		"and latest.json. Delete the report it replaces before committing: git history keeps it.\n\n"+
		"Latest: [%s.md](%s.md) ([targets](latest.json))\n\n", OutDir, latest, latest)
	if _, err := os.Stat(filepath.Join(dir, historyFile+".md")); err == nil {
		fmt.Fprintf(&b, "Earlier reports, and how to get one back from git: [%s.md](%s.md).\n\n", historyFile, historyFile)
	}
	b.WriteString("| report | ratios | chart |\n| --- | --- | --- |\n")
	for _, l := range labels {
		ratios, chart := "—", "—"
		if _, err := os.Stat(filepath.Join(dir, l+".json")); err == nil {
			ratios = fmt.Sprintf("[json](%s.json)", l)
		}
		for _, png := range []string{chartFile(l), l + "-latency-vs-sandboxes.png"} { // the second: reports before issue 60
			if _, err := os.Stat(filepath.Join(dir, png)); err == nil {
				chart = fmt.Sprintf("[png](%s)", png)
				break
			}
		}
		fmt.Fprintf(&b, "| [%s](%s.md) | %s | %s |\n", l, l, ratios, chart)
	}
	return os.WriteFile(filepath.Join(dir, "README.md"), []byte(b.String()), 0o644)
}
