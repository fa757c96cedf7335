package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// Reasons of the decisions the engine makes itself, when policy cannot answer. They are also
// the Code of those decisions (bounded, for metric labels).
const (
	CodeNoPolicy       = "no_policy"
	CodeEvalError      = "policy_error"
	CodeUndefined      = "policy_undefined"
	CodeBadResult      = "policy_bad_result"
	CodeInputError     = "input_error"
	CodePolicyAllow    = "allow"
	CodePolicyDeny     = "deny"
	defaultDebounce    = 200 * time.Millisecond
	maxReasonBytes     = 512
	maxCodeBytes       = 64
	noRevision         = "none"
	reasonNoPolicy     = "no policy is loaded"
	reasonUndefinedFmt = "%s is undefined for this input"
)

// Decision is the answer for one call.
type Decision struct {
	Allow bool
	// Reason is the policy's explanation (shown to the agent for a denied tool call, written to
	// the audit event).
	Reason string
	// Code is a short, bounded classification of the reason for metric labels: the policy's
	// `code` field, else "allow"/"deny", or one of the Code* constants for engine-made denials.
	Code string
	// Credential names the credential to inject, if the policy chose one.
	Credential string
	// ReportOnly marks a denial the policy does not enforce (its result says "enforce":
	// false: the template is in report-only mode). The request path lets such a call through
	// and records the denial it would have made (internal/call). Engine-made denials (errors,
	// no policy) are never report-only.
	ReportOnly bool
	// Revision identifies the policy files that made the decision ("none" when none is loaded).
	Revision string
	// Err is the evaluation error behind an engine-made deny, for logs.
	Err error
}

// Engine evaluates data.sandgate.decision. It is safe for concurrent use; Decide never blocks
// on a reload.
type Engine struct {
	dir      string
	log      *slog.Logger
	onReload func(ReloadResult)
	debounce time.Duration
	cacheMax int

	metrics *engineMetrics

	clock Clock
	poll  time.Duration // Watch's periodic content check; 0: off

	cur      atomic.Pointer[revision]
	reloadMu sync.Mutex // one reload at a time

	stateMu sync.Mutex
	state   reloadState

	bundle *BundleSource // nil: the engine serves dir
}

// ReloadResult reports one reload attempt to an observer (logs, metrics).
type ReloadResult struct {
	Revision string // the revision serving after the attempt
	Changed  bool   // a new revision was installed
	Err      error  // the attempt failed; the previous revision keeps serving
	Reason   string // why it failed, one of the Reload* reasons ("" when it did not)
}

// Option configures an Engine.
type Option func(*Engine)

// WithLogger sets the logger for reloads.
func WithLogger(l *slog.Logger) Option { return func(e *Engine) { e.log = l } }

// WithReloadObserver is called after every reload attempt, including the first load.
func WithReloadObserver(f func(ReloadResult)) Option { return func(e *Engine) { e.onReload = f } }

// WithDecisionCache bounds the decisions remembered per policy revision (see cache.go);
// 0 turns the cache off. Default DefaultCacheEntries.
func WithDecisionCache(entries int) Option { return func(e *Engine) { e.cacheMax = entries } }

// WithDebounce sets how long Watch waits after a file change before reloading.
func WithDebounce(d time.Duration) Option { return func(e *Engine) { e.debounce = d } }

// WithPollInterval sets how often Watch compares the folder's contents with the last reading,
// the backstop for a change the file watcher missed. Default DefaultPollInterval; 0 turns it off.
func WithPollInterval(d time.Duration) Option { return func(e *Engine) { e.poll = max(d, 0) } }

// WithClock replaces the time source of reload bookkeeping (revision age, last success) and of
// Watch's periodic check; tests drive it by hand.
func WithClock(c Clock) Option { return func(e *Engine) { e.clock = c } }

// New loads the policies in dir. A folder that does not compile is an error; a folder with no
// policy files yields an engine that denies everything with reason "no policy is loaded" until
// a reload finds some.
func New(ctx context.Context, dir string, opts ...Option) (*Engine, error) {
	e := newEngine(dir, opts)
	if err := e.Reload(ctx); err != nil && !errors.Is(err, ErrNoPolicy) {
		return nil, err
	}
	return e, nil
}

func newEngine(dir string, opts []Option) *Engine {
	e := &Engine{dir: dir, log: slog.New(slog.DiscardHandler), debounce: defaultDebounce, cacheMax: DefaultCacheEntries,
		clock: systemClock{}, poll: DefaultPollInterval}
	for _, o := range opts {
		o(e)
	}
	return e
}

// Dir is the policy folder (for an engine serving a bundle, the bundle's source).
func (e *Engine) Dir() string { return e.dir }

// Revision is the revision serving now, or "none".
func (e *Engine) Revision() string {
	if r := e.cur.Load(); r != nil {
		return r.id
	}
	return noRevision
}

// Decide evaluates the policy for one call. It never fails: every problem is a deny whose
// Reason says what went wrong. A ctx that is already done is denied with CodeEvalError before
// the decision cache is consulted.
func (e *Engine) Decide(ctx context.Context, in *Input) Decision {
	start := time.Now()
	d := e.decide(ctx, in)
	e.metrics.record(ctx, string(in.Kind), &d, start)
	return d
}

func (e *Engine) decide(ctx context.Context, in *Input) Decision {
	rev := e.cur.Load()
	if rev == nil {
		return Decision{Reason: reasonNoPolicy, Code: CodeNoPolicy, Revision: noRevision}
	}
	// Checked before the cache: a caller that has given up gets the same answer whether or not
	// the decision happens to be remembered.
	if d, done := abandoned(ctx, rev); done {
		return d
	}
	c := rev.cache
	var key []byte
	cached := false
	if c != nil {
		// On a hit the input document is never built: the key reads the struct directly,
		// into a buffer on the stack unless it is long.
		var buf [256]byte
		if key, cached = c.key(buf[:0], in); cached {
			if d, hit := c.get(key); hit {
				e.metrics.cacheLookup(true)
				return d
			}
		}
		e.metrics.cacheLookup(false)
	}
	val, err := in.Value()
	if err != nil {
		return Decision{Reason: "policy input: " + err.Error(), Code: CodeInputError, Revision: rev.id, Err: err}
	}
	d := rev.decide(ctx, val)
	if cached && cacheable(d) {
		c.put(string(key), d)
	}
	return d
}

// DecideDocument evaluates the policy for an input given as a decoded JSON document, as
// `sandgate policy eval` reads it from a file.
func (e *Engine) DecideDocument(ctx context.Context, doc any) Decision {
	rev := e.cur.Load()
	if rev == nil {
		return Decision{Reason: reasonNoPolicy, Code: CodeNoPolicy, Revision: noRevision}
	}
	val, err := ast.InterfaceToValue(doc)
	if err != nil {
		return Decision{Reason: "policy input: " + err.Error(), Code: CodeInputError, Revision: rev.id, Err: err}
	}
	return rev.decide(ctx, val)
}

func (rev *revision) decide(ctx context.Context, val ast.Value) Decision {
	return rev.decideTraced(ctx, val, nil)
}

// decideTraced is decide with a tracer (nil: none), for explanations. It evaluates through
// OPA's rego API, the query prepared once per revision (load.go).
func (rev *revision) decideTraced(ctx context.Context, val ast.Value, tracer topdown.QueryTracer) Decision {
	if d, done := abandoned(ctx, rev); done {
		return d
	}
	opts := []rego.EvalOption{rego.EvalParsedInput(val)}
	if tracer != nil {
		opts = append(opts, rego.EvalQueryTracer(tracer))
	}
	rs, err := rev.prepared.Eval(ctx, opts...)
	if err != nil {
		return Decision{Reason: "policy evaluation failed: " + truncate(err.Error(), maxReasonBytes), Code: CodeEvalError, Revision: rev.id, Err: err}
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return Decision{Reason: fmt.Sprintf(reasonUndefinedFmt, Query), Code: CodeUndefined, Revision: rev.id}
	}
	d := decisionFromResult(rs[0].Expressions[0].Value)
	d.Revision = rev.id
	return d
}

// abandoned is the deny for a context that is done before evaluation starts. The contract is
// that such a call is always denied with CodeEvalError, never answered by the policy or the
// decision cache: the caller has given up (a client gone, a deadline passed) and must not act on
// an allow. A context that ends during evaluation is up to OPA, which may finish the evaluation.
func abandoned(ctx context.Context, rev *revision) (Decision, bool) {
	err := ctx.Err()
	if err == nil {
		return Decision{}, false
	}
	return Decision{Reason: "policy evaluation abandoned: " + err.Error(), Code: CodeEvalError, Revision: rev.id, Err: err}, true
}

// decisionFromResult reads the policy's result as the rego API returns it (decoded JSON).
// Anything but {"allow": true, …} is a deny.
func decisionFromResult(v any) Decision {
	obj, ok := v.(map[string]any)
	if !ok {
		return Decision{Reason: fmt.Sprintf("%s is not an object (got %s)", Query, jsonTypeName(v)), Code: CodeBadResult}
	}
	var d Decision
	allow, ok := obj["allow"].(bool)
	if !ok {
		d.Reason = fmt.Sprintf("%s.allow is not a boolean", Query)
		d.Code = CodeBadResult
		return d
	}
	d.Allow = allow
	reason, _ := obj["reason"].(string)
	d.Reason = truncate(reason, maxReasonBytes)
	d.Credential, _ = obj["credential"].(string)
	if enforce, ok := obj["enforce"].(bool); ok && !enforce && !allow {
		d.ReportOnly = true
	}
	d.Code, _ = obj["code"].(string)
	if d.Code == "" || len(d.Code) > maxCodeBytes {
		d.Code = CodePolicyDeny
		if allow {
			d.Code = CodePolicyAllow
		}
	}
	if d.Reason == "" {
		d.Reason = "denied by policy"
		if allow {
			d.Reason = "allowed by policy"
		}
	}
	return d
}

// jsonTypeName names a decoded JSON value's type as OPA names it in errors.
func jsonTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "number"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Data is the value at data.<path> of the serving revision (nil when it has none): what the
// policy folder's data files or the bundle hold, such as the tool pins (data.tool_pins).
func (e *Engine) Data(ctx context.Context, path ...string) (any, error) {
	r := e.cur.Load()
	if r == nil {
		return nil, nil
	}
	v, err := storage.ReadOne(ctx, r.store, storage.Path(path))
	switch {
	case storage.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	if a, ok := v.(ast.Value); ok { // the store keeps data as Rego values
		return ast.JSON(a)
	}
	return v, nil
}
