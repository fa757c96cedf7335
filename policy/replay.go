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
	// Template, when set, keeps only the decisions of that template's sandboxes.
	Template string
	// Examples is how many changed decisions the report shows, the first ones in the log.
	Examples int
	// Workers evaluates in parallel (default GOMAXPROCS).
	Workers int
}

// Outcome is the part of a decision a replay compares: allow, code and whether a denial was
// enforced. Reason texts are shown but not compared, since policies may put per-call detail
// in them. An empty Code is unknown (an audit event does not record an allow's code) and is
// not compared.
type Outcome struct {
	Allow      bool   `json:"allow"`
	Code       string `json:"code"`
	Reason     string `json:"reason,omitempty"`
	ReportOnly bool   `json:"report_only,omitempty"`
}

func outcomeOf(d Decision) Outcome {
	return Outcome{Allow: d.Allow, Code: d.Code, Reason: d.Reason, ReportOnly: d.ReportOnly}
}

// Change directions.
const (
	AllowToDeny = "allow→deny"
	DenyToAllow = "deny→allow"
	CodeChanged = "code changed"
	// EnforceChanged is a denial that stays a denial but becomes enforced or report-only.
	EnforceChanged = "enforce changed"
)

// ReplayChange counts the changed decisions that share a kind, template and change of code.
type ReplayChange struct {
	Direction string `json:"direction"`
	Kind      string `json:"kind"`
	Template  string `json:"template"`
	FromCode  string `json:"from_code"`
	ToCode    string `json:"to_code"`
	Count     int    `json:"count"`
	// Targets are the most frequent targets of the row (upstream/tool, METHOD host/path), at
	// most maxChangeTargets, most frequent first: what the change is about.
	Targets []ReplayTarget `json:"targets"`
}

// ReplayTarget is one target of a ReplayChange and how many of its decisions it had.
type ReplayTarget struct {
	Target string `json:"target"`
	Count  int    `json:"count"`
}

const maxChangeTargets = 5

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

// Replay sources.
const (
	SourceDecisionLog = "decision log"
	SourceAuditLog    = "audit log"
)

// ReplayReport is what a replay found.
type ReplayReport struct {
	// Source is SourceDecisionLog or SourceAuditLog.
	Source   string `json:"source"`
	Revision string `json:"revision"`
	// Baseline is the revision whose decisions an audit log replay compares with (audit events
	// do not hold a decision's code, so both are evaluated); empty for the decision log.
	Baseline string `json:"baseline,omitempty"`
	// Read counts the logged decisions; Filtered those outside Since/Sandbox/Template;
	// Replayed the rest.
	Read        int `json:"read"`
	Filtered    int `json:"filtered"`
	Replayed    int `json:"replayed"`
	Unchanged   int `json:"unchanged"`
	AllowToDeny int `json:"allow_to_deny"`
	DenyToAllow int `json:"deny_to_allow"`
	// CodeChanged counts decisions whose allow stayed but whose code (or enforcement) changed.
	CodeChanged int `json:"code_changed"`
	// MaskedChanged counts changed decisions whose logged input had masked values: the replay
	// saw "**masked**" where the call had the real value, so the change may be an artefact.
	MaskedChanged int             `json:"masked_changed"`
	Changes       []ReplayChange  `json:"changes"`
	Examples      []ReplayExample `json:"examples"`
	Elapsed       time.Duration   `json:"elapsed_ns"`

	changes map[changeKey]map[string]int // merged into Changes
}

type changeKey struct{ direction, kind, template, from, to string }

// Changed reports whether any replayed decision differs from the logged one.
func (r *ReplayReport) Changed() bool { return r.AllowToDeny+r.DenyToAllow+r.CodeChanged > 0 }

// pastDecision is one decision as a log recorded it: its input and what was decided.
type pastDecision struct {
	id     string
	at     time.Time
	input  any
	logged Outcome
	masked bool
	// missing are the input paths the source does not hold (an audit event's arguments):
	// a policy that reads one cannot be replayed on it faithfully.
	missing [][]string
	facts   decisionFacts
}

// replaySource reads a log's records in batches and decodes one into the decision it holds
// (nil: a record that is not a decision to replay, such as a shadow's).
type replaySource interface {
	read(ctx context.Context, out chan<- replayBatch) error
	decode(ctx context.Context, item any, seq int) (*pastDecision, error)
}

type replayBatch struct {
	seq   int
	items []any
}

const replayBatchLines = 256

// Replay re-evaluates every decision in the decision log whose active file is path under the
// engine's current revision and reports what would change. The engine should have its cache
// off (WithDecisionCache(0)): every input is seen once.
func Replay(ctx context.Context, e *Engine, path string, opts ReplayOptions) (*ReplayReport, error) {
	r, err := replay(ctx, e, decisionLogSource{path: path}, opts)
	if err != nil {
		return nil, err
	}
	r.Source = SourceDecisionLog
	return r, nil
}

func replay(ctx context.Context, e *Engine, src replaySource, opts ReplayOptions) (*ReplayReport, error) {
	start := time.Now()
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	batches := make(chan replayBatch, opts.Workers*2)
	parts := make([]*ReplayReport, opts.Workers)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for i := range parts {
		parts[i] = &ReplayReport{changes: map[changeKey]map[string]int{}}
		wg.Go(func() {
			for b := range batches {
				for j, item := range b.items {
					if ctx.Err() != nil {
						continue // drain: the reader stops at the cancellation
					}
					if err := replayItem(ctx, e, src, item, b.seq+j, &opts, parts[i]); err != nil {
						cancel(err)
					}
				}
			}
		})
	}
	readErr := src.read(ctx, batches)
	close(batches)
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

func replayItem(ctx context.Context, e *Engine, src replaySource, item any, seq int, opts *ReplayOptions, r *ReplayReport) error {
	p, err := src.decode(ctx, item, seq)
	if err != nil || p == nil {
		return err
	}
	r.Read++
	f := &p.facts
	if (!opts.Since.IsZero() && p.at.Before(opts.Since)) ||
		(opts.Sandbox != "" && (f.namespace != opts.Namespace || f.sandbox != opts.Sandbox)) ||
		(opts.Template != "" && f.template != opts.Template) {
		r.Filtered++
		return nil
	}
	var after Outcome
	if len(p.missing) == 0 {
		after = outcomeOf(e.DecideDocument(ctx, p.input))
	} else {
		d, read := e.decideReading(ctx, p.input, p.missing)
		if len(read) > 0 {
			return missingInputError(p, read, e.Revision())
		}
		after = outcomeOf(d)
	}
	r.Replayed++
	r.compare(p, after, seq, opts.Examples)
	return nil
}

// compare counts one replayed decision.
func (r *ReplayReport) compare(p *pastDecision, after Outcome, seq, examples int) {
	before := p.logged
	dir := ""
	switch {
	case before.Allow && !after.Allow:
		dir, r.AllowToDeny = AllowToDeny, r.AllowToDeny+1
	case !before.Allow && after.Allow:
		dir, r.DenyToAllow = DenyToAllow, r.DenyToAllow+1
	case before.Code != "" && before.Code != after.Code:
		dir, r.CodeChanged = CodeChanged, r.CodeChanged+1
	case !before.Allow && before.ReportOnly != after.ReportOnly:
		dir, r.CodeChanged = EnforceChanged, r.CodeChanged+1
	default:
		r.Unchanged++
		return
	}
	if p.masked {
		r.MaskedChanged++
	}
	f := &p.facts
	k := changeKey{direction: dir, kind: f.kind, template: f.template, from: before.Code, to: after.Code}
	if r.changes[k] == nil {
		r.changes[k] = map[string]int{}
	}
	r.changes[k][f.target]++
	if examples > 0 {
		ex := ReplayExample{DecisionID: p.id, Time: p.at, Kind: f.kind, Sandbox: f.namespace + "/" + f.sandbox,
			Template: f.template, Target: f.target, Masked: p.masked, Logged: before, Replayed: after, seq: seq}
		r.Examples = keepFirst(r.Examples, ex, examples)
	}
}

// decisionLogSource reads the decision log whose active file is path, oldest file first.
type decisionLogSource struct{ path string }

func (s decisionLogSource) read(ctx context.Context, out chan<- replayBatch) error {
	files, err := DecisionLogFiles(s.path)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no decision log at %s (policy.decision_log.file)", s.path)
	}
	b := &batcher{out: out}
	for _, name := range files {
		if err := scanDecisionFile(name, func(line []byte) error { return b.add(ctx, line) }); err != nil {
			return err
		}
	}
	b.flush()
	return nil
}

func (decisionLogSource) decode(_ context.Context, item any, seq int) (*pastDecision, error) {
	ev, err := ReadDecisionEvent(item.([]byte))
	if err != nil {
		return nil, fmt.Errorf("decision %d of the log: %w", seq+1, err)
	}
	if ev.Path == ShadowPath {
		return nil, nil // a shadow policy's divergence, not a decision that was enforced
	}
	return &pastDecision{id: ev.DecisionID, at: ev.Timestamp, input: *ev.Input,
		logged: outcomeOf(DecisionFromResult(ev.Result, "")), masked: len(ev.Masked) > 0, facts: factsOf(*ev.Input)}, nil
}

// batcher sends items in batches of replayBatchLines, numbering them.
type batcher struct {
	out chan<- replayBatch
	b   replayBatch
}

func (b *batcher) add(ctx context.Context, item any) error {
	b.b.items = append(b.b.items, item)
	if len(b.b.items) < replayBatchLines {
		return nil
	}
	select {
	case b.out <- b.b:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	b.b = replayBatch{seq: b.b.seq + len(b.b.items)}
	return nil
}

func (b *batcher) flush() {
	if len(b.b.items) > 0 {
		b.out <- b.b
	}
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
		if bytes.Contains(line, []byte(`"prev_hash"`)) {
			return nil, errors.New("this is an audit log, not a decision log: name the audit folder (policy replay --from var/audit), or the decision log (policy.decision_log.file)")
		}
		return nil, fmt.Errorf("decision %q has no input", ev.DecisionID)
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
	changes := map[changeKey]map[string]int{}
	for _, p := range parts {
		r.Read += p.Read
		r.Filtered += p.Filtered
		r.Replayed += p.Replayed
		r.Unchanged += p.Unchanged
		r.AllowToDeny += p.AllowToDeny
		r.DenyToAllow += p.DenyToAllow
		r.CodeChanged += p.CodeChanged
		r.MaskedChanged += p.MaskedChanged
		for k, targets := range p.changes {
			if changes[k] == nil {
				changes[k] = map[string]int{}
			}
			for t, n := range targets {
				changes[k][t] += n
			}
		}
		r.Examples = append(r.Examples, p.Examples...)
	}
	for k, targets := range changes {
		c := ReplayChange{Direction: k.direction, Kind: k.kind, Template: k.template, FromCode: k.from, ToCode: k.to}
		for t, n := range targets {
			c.Count += n
			c.Targets = append(c.Targets, ReplayTarget{Target: t, Count: n})
		}
		slices.SortFunc(c.Targets, func(a, b ReplayTarget) int {
			return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Target, b.Target))
		})
		c.Targets = c.Targets[:min(len(c.Targets), maxChangeTargets)]
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

// ScanDecisionLog calls fn with every enforced decision of the decision log whose active file
// is path (rotated files first, a shadow's divergences left out): its id, time, logged input
// and result. An error from fn stops it and is returned.
func ScanDecisionLog(ctx context.Context, path string, fn func(id string, at time.Time, input any, d Decision) error) error {
	files, err := DecisionLogFiles(path)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no decision log at %s (policy.decision_log.file)", path)
	}
	seq := 0
	for _, name := range files {
		err := scanDecisionFile(name, func(line []byte) error {
			seq++
			if err := ctx.Err(); err != nil {
				return err
			}
			ev, err := ReadDecisionEvent(line)
			if err != nil {
				return fmt.Errorf("decision %d of the log: %w", seq, err)
			}
			if ev.Path == ShadowPath {
				return nil
			}
			return fn(ev.DecisionID, ev.Timestamp, *ev.Input, DecisionFromResult(ev.Result, ev.Bundles[BundleName].Revision))
		})
		if err != nil {
			return err
		}
	}
	return nil
}
