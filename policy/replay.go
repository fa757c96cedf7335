package policy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins/logs"
)

// ReplayOptions select and shape a replay. Zero values replay everything.
type ReplayOptions struct {
	// Since skips decisions logged before it.
	Since time.Time
	// Namespace and Sandbox, when set, keep only that sandbox's decisions.
	Namespace, Sandbox string
	// Examples is how many changed decisions the report shows, the first ones in the log.
	Examples int
	// Workers evaluates in parallel (default GOMAXPROCS).
	Workers int
}

// Outcome is the part of a decision a replay compares: allow and code. Reason texts are shown
// but not compared, since policies may put per-call detail in them.
type Outcome struct {
	Allow  bool   `json:"allow"`
	Code   string `json:"code"`
	Reason string `json:"reason,omitempty"`
}

func outcomeOf(d Decision) Outcome { return Outcome{Allow: d.Allow, Code: d.Code, Reason: d.Reason} }

// Change directions.
const (
	AllowToDeny = "allow→deny"
	DenyToAllow = "deny→allow"
	CodeChanged = "code changed"
)

// ReplayChange counts the changed decisions that share a kind, template and change of code.
type ReplayChange struct {
	Direction string `json:"direction"`
	Kind      string `json:"kind"`
	Template  string `json:"template"`
	FromCode  string `json:"from_code"`
	ToCode    string `json:"to_code"`
	Count     int    `json:"count"`
}

// ReplayExample is one changed decision.
type ReplayExample struct {
	DecisionID string    `json:"decision_id"`
	Time       time.Time `json:"time"`
	Kind       string    `json:"kind"`
	Sandbox    string    `json:"sandbox"` // namespace/name
	Template   string    `json:"template,omitempty"`
	Target     string    `json:"target"` // upstream/tool, or METHOD host/path
	Masked     bool      `json:"masked,omitempty"`
	Logged     Outcome   `json:"logged"`
	Replayed   Outcome   `json:"replayed"`
	seq        int
}

// ReplayReport is what a replay found.
type ReplayReport struct {
	Revision string `json:"revision"`
	// Read counts the logged decisions; Filtered those outside Since/Sandbox; Replayed the rest.
	Read        int `json:"read"`
	Filtered    int `json:"filtered"`
	Replayed    int `json:"replayed"`
	Unchanged   int `json:"unchanged"`
	AllowToDeny int `json:"allow_to_deny"`
	DenyToAllow int `json:"deny_to_allow"`
	// CodeChanged counts decisions whose allow stayed but whose code changed.
	CodeChanged int `json:"code_changed"`
	// MaskedChanged counts changed decisions whose logged input had masked values: the replay
	// saw "**masked**" where the call had the real value, so the change may be an artefact.
	MaskedChanged int             `json:"masked_changed"`
	Changes       []ReplayChange  `json:"changes"`
	Examples      []ReplayExample `json:"examples"`
	Elapsed       time.Duration   `json:"elapsed_ns"`
}

// Changed reports whether any replayed decision differs from the logged one.
func (r *ReplayReport) Changed() bool { return r.AllowToDeny+r.DenyToAllow+r.CodeChanged > 0 }

// Replay re-evaluates every decision in the decision log whose active file is path under the
// engine's current revision and reports what would change. The engine should have its cache
// off (WithDecisionCache(0)): every input is seen once.
func Replay(ctx context.Context, e *Engine, path string, opts ReplayOptions) (*ReplayReport, error) {
	start := time.Now()
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	lines := make(chan replayBatch, opts.Workers*2)
	parts := make([]*ReplayReport, opts.Workers)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for i := range parts {
		parts[i] = &ReplayReport{}
		wg.Go(func() {
			for b := range lines {
				for j, line := range b.lines {
					if err := replayLine(ctx, e, line, b.seq+j, &opts, parts[i]); err != nil {
						cancel(err)
					}
				}
			}
		})
	}
	readErr := readDecisionLines(ctx, path, lines)
	close(lines)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	if readErr != nil {
		return nil, readErr
	}
	r := mergeReplay(parts, opts.Examples)
	r.Revision, r.Elapsed = e.Revision(), time.Since(start)
	return r, nil
}

type replayBatch struct {
	seq   int
	lines [][]byte
}

const replayBatchLines = 256

// readDecisionLines sends the log's lines, oldest file first, in batches.
func readDecisionLines(ctx context.Context, path string, out chan<- replayBatch) error {
	files, err := DecisionLogFiles(path)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no decision log at %s (policy.decision_log.file)", path)
	}
	seq := 0
	b := replayBatch{}
	for _, name := range files {
		err := scanDecisionFile(name, func(line []byte) error {
			b.lines = append(b.lines, line)
			if len(b.lines) == replayBatchLines {
				select {
				case out <- b:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
				seq += len(b.lines)
				b = replayBatch{seq: seq}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if len(b.lines) > 0 {
		out <- b
	}
	return nil
}

// scanDecisionFile calls fn with a copy of every non-empty line of the file.
func scanDecisionFile(name string, fn func(line []byte) error) error {
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("decision log: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	n := 0
	for sc.Scan() {
		n++
		if len(sc.Bytes()) == 0 {
			continue
		}
		if err := fn(slices.Clone(sc.Bytes())); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("decision log %s after line %d: %w", name, n, err)
	}
	return nil
}

// ReadDecisionEvent decodes one line of the decision log.
func ReadDecisionEvent(line []byte) (*logs.EventV1, error) {
	var ev logs.EventV1
	if err := json.Unmarshal(line, &ev); err != nil {
		return nil, fmt.Errorf("decision log line: %w", err)
	}
	if ev.Input == nil {
		return nil, fmt.Errorf("decision %s has no input", ev.DecisionID)
	}
	return &ev, nil
}

// FindDecision returns the logged decision with that id.
func FindDecision(path, id string) (*logs.EventV1, error) {
	files, err := DecisionLogFiles(path)
	if err != nil {
		return nil, err
	}
	needle := []byte(`"decision_id":"` + id + `"`)
	var found *logs.EventV1
	errFound := errors.New("found")
	for _, name := range files {
		err := scanDecisionFile(name, func(line []byte) error {
			if !bytes.Contains(line, needle) {
				return nil
			}
			ev, err := ReadDecisionEvent(line)
			if err == nil && ev.DecisionID == id && ev.Path != ShadowPath {
				found = ev
				return errFound
			}
			return nil
		})
		if err != nil && !errors.Is(err, errFound) {
			return nil, err
		}
		if found != nil {
			return found, nil
		}
	}
	return nil, fmt.Errorf("no decision %s in the decision log at %s", id, path)
}

func replayLine(ctx context.Context, e *Engine, line []byte, seq int, opts *ReplayOptions, r *ReplayReport) error {
	ev, err := ReadDecisionEvent(line)
	if err != nil {
		return fmt.Errorf("decision %d of the log: %w", seq+1, err)
	}
	if ev.Path == ShadowPath {
		// A shadow policy's divergence, not a decision that was enforced.
		return nil
	}
	r.Read++
	facts := factsOf(*ev.Input)
	if (!opts.Since.IsZero() && ev.Timestamp.Before(opts.Since)) ||
		(opts.Sandbox != "" && (facts.namespace != opts.Namespace || facts.sandbox != opts.Sandbox)) {
		r.Filtered++
		return nil
	}
	r.Replayed++
	before := outcomeOf(DecisionFromResult(ev.Result, ""))
	after := outcomeOf(e.DecideDocument(ctx, *ev.Input))
	dir := ""
	switch {
	case before.Allow && !after.Allow:
		dir, r.AllowToDeny = AllowToDeny, r.AllowToDeny+1
	case !before.Allow && after.Allow:
		dir, r.DenyToAllow = DenyToAllow, r.DenyToAllow+1
	case before.Code != after.Code:
		dir, r.CodeChanged = CodeChanged, r.CodeChanged+1
	default:
		r.Unchanged++
		return nil
	}
	masked := len(ev.Masked) > 0
	if masked {
		r.MaskedChanged++
	}
	r.Changes = append(r.Changes, ReplayChange{Direction: dir, Kind: facts.kind, Template: facts.template,
		FromCode: before.Code, ToCode: after.Code, Count: 1})
	if opts.Examples > 0 {
		ex := ReplayExample{DecisionID: ev.DecisionID, Time: ev.Timestamp, Kind: facts.kind,
			Sandbox: facts.namespace + "/" + facts.sandbox, Template: facts.template, Target: facts.target,
			Masked: masked, Logged: before, Replayed: after, seq: seq}
		r.Examples = keepFirst(r.Examples, ex, opts.Examples)
	}
	return nil
}

// keepFirst adds ex to the examples with the smallest sequence numbers, at most n of them.
func keepFirst(examples []ReplayExample, ex ReplayExample, n int) []ReplayExample {
	if len(examples) < n {
		return append(examples, ex)
	}
	last := 0
	for i := range examples {
		if examples[i].seq > examples[last].seq {
			last = i
		}
	}
	if ex.seq < examples[last].seq {
		examples[last] = ex
	}
	return examples
}

func mergeReplay(parts []*ReplayReport, examples int) *ReplayReport {
	r := &ReplayReport{Changes: []ReplayChange{}, Examples: []ReplayExample{}}
	counts := map[ReplayChange]int{}
	for _, p := range parts {
		r.Read += p.Read
		r.Filtered += p.Filtered
		r.Replayed += p.Replayed
		r.Unchanged += p.Unchanged
		r.AllowToDeny += p.AllowToDeny
		r.DenyToAllow += p.DenyToAllow
		r.CodeChanged += p.CodeChanged
		r.MaskedChanged += p.MaskedChanged
		for _, c := range p.Changes {
			c.Count = 0
			counts[c]++
		}
		r.Examples = append(r.Examples, p.Examples...)
	}
	for c, n := range counts {
		c.Count = n
		r.Changes = append(r.Changes, c)
	}
	slices.SortFunc(r.Changes, func(a, b ReplayChange) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.Kind, b.Kind),
			cmp.Compare(a.Template, b.Template), cmp.Compare(a.FromCode, b.FromCode), cmp.Compare(a.ToCode, b.ToCode))
	})
	slices.SortFunc(r.Examples, func(a, b ReplayExample) int { return cmp.Compare(a.seq, b.seq) })
	r.Examples = r.Examples[:min(len(r.Examples), examples)]
	return r
}

// decisionFacts are the parts of a logged input a replay groups and filters by.
type decisionFacts struct {
	kind, namespace, sandbox, template, target string
}

func factsOf(input any) decisionFacts {
	doc, _ := input.(map[string]any)
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	id, _ := doc["identity"].(map[string]any)
	f := decisionFacts{kind: str(doc, "kind"), namespace: str(id, "namespace"), sandbox: str(id, "sandbox"), template: str(id, "template")}
	if m, ok := doc["mcp"].(map[string]any); ok {
		f.target = str(m, "upstream") + "/" + str(m, "tool")
	} else if h, ok := doc["http"].(map[string]any); ok {
		f.target = str(h, "method") + " " + str(h, "host") + str(h, "path")
	}
	return f
}
