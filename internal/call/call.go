package call

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/admission"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// Decider is what the request path needs of the policy engine (*policy.Engine).
type Decider interface {
	Decide(ctx context.Context, in *policy.Input) policy.Decision
	// Revision is the serving policy revision, for events of calls no decision was made for.
	Revision() string
}

// DecisionRecorder receives every decision Authorize makes, with the ID of the call's audit
// event (*policy.DecisionLog). It must not block.
type DecisionRecorder interface {
	Record(id string, in *policy.Input, d policy.Decision)
}

// Options are the Core's dependencies. Policy and Audit are required.
type Options struct {
	Policy Decider
	Audit  audit.Recorder
	// Admission counts calls against budgets and adds usage and grants to the input; nil
	// counts nothing.
	Admission *admission.Admission
	Meters    metric.MeterProvider
	Tracer    trace.TracerProvider
	Log       *slog.Logger
	// Rejections bounds the events of protocol-level rejections per source address.
	Rejections RejectionLimit
	// Decisions, if set, logs each call's decision and input (the policy decision log).
	Decisions DecisionRecorder
	// Shadow, if set, evaluates each decided call under a shadow policy off the request path;
	// a divergence ready when the event is written goes into it (*policy.Shadow).
	Shadow ShadowSubmitter
	// Credentials are the values a call may inject (*credential.Store); nil holds none. One
	// that also mints per run (MintedCredentials) puts input.credential in the input of a call
	// whose destination injects a minted credential, and the call takes the run's token.
	Credentials Credentials
}

// ShadowSubmitter queues a decided call for a shadow policy without blocking (*policy.Shadow).
type ShadowSubmitter interface {
	Submit(id string, in *policy.Input, enforced policy.Decision) *policy.ShadowPending
}

// Core is the request path both halves share. It is safe for concurrent use.
type Core struct {
	opts    Options
	log     *slog.Logger
	tracer  trace.Tracer
	metrics *metrics
	rejects *rejections
	// blocking says the recorder returns once an event is written: answers are held for it.
	blocking bool
	inflight atomic.Int64
}

// New builds the Core.
func New(opts Options) (*Core, error) {
	if opts.Policy == nil || opts.Audit == nil {
		return nil, errors.New("call: Options.Policy and Options.Audit are required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Credentials == nil {
		opts.Credentials = noCredentials{}
	}
	if opts.Meters == nil {
		opts.Meters = noop.NewMeterProvider()
	}
	if opts.Tracer == nil {
		opts.Tracer = tracenoop.NewTracerProvider()
	}
	m, err := newMetrics(opts.Meters)
	if err != nil {
		return nil, err
	}
	c := &Core{opts: opts, log: opts.Log, metrics: m, tracer: opts.Tracer.Tracer("github.com/sandgate/sandgate")}
	if b, ok := opts.Audit.(blockingRecorder); ok {
		c.blocking = b.Blocking()
	}
	c.rejects = newRejections(opts.Rejections.withDefaults())
	return c, nil
}

// Admission is the Core's admission step (nil when nothing is counted), for the steps that
// happen after the decision (concurrency slots, token charges).
func (c *Core) Admission() *admission.Admission { return c.opts.Admission }

// Decide asks policy alone, for what is not a call of its own (whether a list entry is
// visible). Nothing is counted and no event is written: the list call has its own, and it is
// that call that fails closed when the audit log is down. The log's health is not asked here:
// mcp-go applies the visibility filter to tools/call too, and a tool hidden because the log
// failed between the call's start and the filter answered "tool not found" instead of the
// call's own "audit log unavailable".
//
// A report-only denial (policy.Decision.ReportOnly) comes back allowed: in report-only mode a
// sandbox sees what it will be able to call, and its calls are decided, and recorded, by
// Authorize.
func (c *Core) Decide(ctx context.Context, in *policy.Input) policy.Decision {
	d := c.opts.Policy.Decide(ctx, in)
	if d.ReportOnly {
		d.Allow = true
	}
	return d
}

// Call is one sandbox-facing request on its way to exactly one audit event. Run begins and
// ends it (finish, refuse, hide or fail); the half notes what it learns (Describe, Answered,
// Note …) in between. Later ends, and later notes, do nothing.
type Call struct {
	core  *Core
	start time.Time
	span  trace.Span
	ctx   context.Context
	// ev is the call's audit event (event.go sets it); Finish completes and writes it.
	ev audit.Event
	// BytesIn and BytesOut count the request and response body bytes.
	BytesIn, BytesOut atomic.Int64
	// tokensIn and tokensOut are the model tokens the response reported (SetUsage).
	tokensIn, tokensOut int64
	decided             bool
	done                atomic.Bool
	// slot is the room the audit log set aside for the event when the call began; noSlot says
	// why there is none (the call is then refused: AuditRefusal).
	slot   audit.Slot
	noSlot error
	shadow *policy.ShadowPending
	// counting says whether admission let the call go on uncounted (limits store unreachable,
	// fail_open): the event then says limits "unavailable".
	counting admission.Counting
	// refusal is what Refuse ended the call with, for the headers of an answer written after
	// it (an MCP tool result: Retry-After).
	refusal atomic.Pointer[Refusal]
	// release is the request's answer as its connection server holds it (nil: none).
	release *Release
	// outlives says Act handed the call's end on (Grant.Later): Run does not finish it.
	outlives bool
	// hidden says the decision's refusal is answered as absence (Question.Hidden).
	hidden bool
	// minted is the scope Authorize put in the input as input.credential (nil: none); taken
	// the minted token takeCredential took, for the requests the call sends (CredentialValue).
	minted *mintedScope
	taken  *takenCredential
	// mint holds minted, taken and ev.CredentialToken in one allocation, made by a call of a
	// minted credential only (mintState).
	mint *mintState
}

type callKey struct{}

// From returns the call ctx carries, or nil.
func From(ctx context.Context) *Call {
	c, _ := ctx.Value(callKey{}).(*Call)
	return c
}

// begin starts a call of kind by id and returns a context that carries it (and its span).
func (c *Core) begin(ctx context.Context, kind audit.Kind, id identity.Identity) (context.Context, *Call) {
	cl := &Call{core: c, start: time.Now(), release: ReleaseFrom(ctx)}
	c.inflight.Add(1)
	if c.blocking && cl.release != nil {
		cl.release.hold.Store(true) // the answer's final bytes wait for this call's event
	}
	ctx, cl.span = c.tracer.Start(ctx, string(kind), trace.WithSpanKind(trace.SpanKindServer))
	cl.ev = audit.Event{Kind: kind, Identity: id}
	// Minted now, not when the event is recorded, so the decision log can name the event.
	cl.ev.AssignID()
	// Room for the event is taken before anything is answered, so that an answered call's
	// event is written even if the disk fills up meanwhile (docs/audit.md).
	if r, ok := c.opts.Audit.(audit.ReservingRecorder); ok {
		cl.slot, cl.noSlot = r.Reserve()
	}
	ctx = context.WithValue(ctx, callKey{}, cl)
	ctx = admission.WithCounting(ctx, &cl.counting)
	cl.ctx = ctx
	return ctx, cl
}

// auditRefusal is the refusal of a call whose event the audit log has no room for (nil when
// it has): such a call must be refused before anything else is answered. Authorize checks it;
// a half that answers a call without Authorize checks it itself.
func (cl *Call) auditRefusal() *Refusal {
	if cl.noSlot != nil {
		return Refuse(CodeAuditUnavailable, "audit log unavailable")
	}
	return nil
}

// Shadow is the call's shadow evaluation (nil: none was queued), for tests that wait for it;
// the request path never waits.
func (cl *Call) Shadow() *policy.ShadowPending { return cl.shadow }

// Start is when the call began.
func (cl *Call) Start() time.Time { return cl.start }

// Detached is the call's context (the one Begin returned) without its cancellation, for work
// of the call that may outlive its request, such as charging the tokens of a finished stream.
func (cl *Call) Detached() context.Context { return context.WithoutCancel(cl.ctx) }

// Span is the call's span (a no-op span when tracing is off).
func (cl *Call) Span() trace.Span { return cl.span }

// authorize is the decision step: the audit log must be able to record the call (fail
// closed), admission counts it when admit is set (and adds usage and grants to in), and
// policy decides. The decision is recorded on the event and, with its input, in the decision
// log under the event's ID (refusals before policy decides are not decisions). A nil refusal means the call may go
// on; otherwise the half answers with the refusal and ends the call with Refuse.
func (cl *Call) authorize(ctx context.Context, in *policy.Input, admit bool) (policy.Decision, *Refusal) {
	core := cl.core
	cl.decided = true
	if rf := cl.auditRefusal(); rf != nil {
		return policy.Decision{}, rf
	}
	if err := core.opts.Audit.Healthy(); err != nil {
		return policy.Decision{}, Refuse(CodeAuditUnavailable, "audit log unavailable")
	}
	if !in.Identity.Known {
		// Unknown callers are still decided by policy (it may choose to say why), but are
		// neither counted nor given grants.
		admit = false
	}
	if admit && core.opts.Admission != nil {
		if r := core.opts.Admission.Admit(ctx, in); r != nil {
			return policy.Decision{}, &Refusal{Code: string(r.Code), Reason: r.Reason, RetryAfter: r.RetryAfter}
		}
	}
	cl.scopeCredential(in)
	d := core.opts.Policy.Decide(ctx, in)
	if core.opts.Decisions != nil {
		core.opts.Decisions.Record(cl.ev.ID, in, d)
	}
	if core.opts.Shadow != nil {
		cl.shadow = core.opts.Shadow.Submit(cl.ev.ID, in, d)
	}
	cl.ev.Decision = audit.Decision{Allow: d.Allow, Reason: d.Reason, PolicyRevision: d.Revision}
	cl.span.SetAttributes(attribute.Bool("sandgate.decision.allow", d.Allow), attribute.String("sandgate.decision.code", d.Code))
	if d.Allow {
		return d, nil
	}
	code := d.Code
	if code == "" {
		code = "deny"
	}
	if d.ReportOnly {
		// Report-only mode: the denial is recorded (event, metric, decision log as the policy
		// answered) and the call goes on as allowed. Only a policy's own denial can be
		// report-only; an engine's (error, no policy) always refuses.
		d.Allow = true
		cl.ev.Decision.Allow, cl.ev.Decision.WouldDeny = true, code
		cl.span.SetAttributes(attribute.String("sandgate.decision.would_deny", code))
		core.metrics.reportOnly(ctx, in.Kind, code)
		return d, nil
	}
	return d, &Refusal{Code: code, Reason: d.Reason}
}

// refuse ends the call as refused by r: the event says deny with r's reason and code and the
// refusal's status. It returns r's status for the half's answer.
func (cl *Call) refuse(r *Refusal) int {
	if cl.done.Load() {
		return r.Status()
	}
	cl.refusal.Store(r)
	cl.refused(r, r.Status())
	cl.finish()
	return r.Status()
}

// Refusal is the refusal Refuse ended the call with, or nil.
func (cl *Call) Refusal() *Refusal { return cl.refusal.Load() }

// hide ends the call as refused by r, answered as if what it asked for did not exist (404): a
// hidden resource answers exactly like a missing one. The event keeps r's reason and code.
func (cl *Call) hide(r *Refusal) {
	if cl.done.Load() {
		return
	}
	cl.refused(r, classes[ClassNotFound].status)
	cl.finish()
}

// fail ends an allowed call whose action failed (an upstream error): the decision stands, the
// outcome says what went wrong.
func (cl *Call) fail(r *Refusal) int {
	if cl.done.Load() {
		return r.Status()
	}
	cl.failed(r)
	cl.finish()
	return r.Status()
}

// finish writes the call's one audit event and its metrics and ends its span. The event gets
// the serving revision when no decision named one, the duration, bytes and tokens; a call cut
// by the end of the shutdown drain gets CodeShutdown.
//
// With blocking delivery Finish returns once the event is written: this is where an answer
// waits for its event. The half calls it before its handler returns, and the connection server
// sends the answer's final bytes only after that, and never when the write was not confirmed
// (Release).
func (cl *Call) finish() {
	if cl.done.Swap(true) {
		return
	}
	defer cl.core.inflight.Add(-1)
	core := cl.core
	elapsed := time.Since(cl.start)
	ev := &cl.ev
	ev.Time = cl.start.UTC()
	ev.Outcome.DurationMS = float64(elapsed.Microseconds()) / 1000
	ev.Outcome.BytesIn, ev.Outcome.BytesOut = cl.BytesIn.Load(), cl.BytesOut.Load()
	ev.Outcome.TokensIn, ev.Outcome.TokensOut = cl.tokensIn, cl.tokensOut
	if ev.Decision.PolicyRevision == "" {
		ev.Decision.PolicyRevision = core.opts.Policy.Revision()
	}
	if s := cl.shadow.Collect(); s != nil {
		ev.Shadow = &audit.ShadowDecision{Allow: s.Allow, Reason: s.Reason, Code: s.Code, Revision: s.Revision}
	}
	if cl.counting.Uncounted() {
		ev.Limits = audit.LimitsUnavailable
	}
	if cl.ctx.Err() != nil && errors.Is(context.Cause(cl.ctx), ErrShutdown) {
		ev.Outcome.Error = CodeShutdown
	}
	if !cl.decided && ev.Outcome.Error == "" && ev.Decision.Reason == "" {
		// A request no policy decides (ping, initialize …) that Sandgate served.
		ev.Decision.Allow, ev.Decision.Reason = true, "served"
	}
	code := ev.Outcome.Error
	if code == "" {
		code = "ok"
	}
	core.metrics.call(cl.ctx, ev, code, elapsed)
	if sc := cl.span.SpanContext(); sc.IsValid() {
		ev.TraceID, ev.SpanID = sc.TraceID().String(), sc.SpanID().String()
		cl.span.SetAttributes(
			attribute.String("sandgate.identity.namespace", ev.Identity.Namespace),
			attribute.String("sandgate.identity.sandbox", ev.Identity.Sandbox),
			attribute.String("sandgate.identity.template", ev.Identity.Template),
			attribute.Bool("sandgate.decision.allow", ev.Decision.Allow),
			attribute.String("sandgate.decision.code", code),
			attribute.String("sandgate.upstream", firstNonEmpty(ev.Target.Upstream, ev.Target.Host)),
			attribute.String("sandgate.tool", ev.Target.Tool),
			attribute.String("sandgate.route", ev.Target.Route),
			attribute.Int("http.response.status_code", ev.Outcome.Status),
		)
	}
	cl.span.End()
	core.record(cl.ctx, ev, cl)
}

// record writes ev, on the call's slot when it has one. A write error after the call happened
// cannot undo it: it is logged and counted, the next calls are refused while the recorder
// reports unhealthy, and with blocking delivery the answer is cut (Release.Cut). With a slot the only such errors are a closed writer (shutdown) and a queue
// that stayed full; without one (a call refused because the log had no room), the refusal's
// event is not written while the log cannot take it: counted in sandgate_audit_write_errors_total.
func (c *Core) record(ctx context.Context, ev *audit.Event, cl *Call) {
	var err error
	if r, ok := c.opts.Audit.(audit.ReservingRecorder); ok && cl.noSlot == nil {
		err = r.RecordReserved(ev, cl.slot)
	} else {
		err = c.opts.Audit.Record(ev)
	}
	if err != nil {
		// The answer of a call whose event was not written is cut, except the fail-closed
		// refusal itself: it says the log is down, does nothing, and withholding it would leave
		// the client a dropped connection instead of the reason (docs/audit.md).
		if c.blocking && ev.Outcome.Error != CodeAuditUnavailable {
			cl.release.cutAnswer()
		}
		c.metrics.auditErrors.Add(ctx, 1)
		c.log.Error("audit event not recorded", "kind", ev.Kind, "sandbox", ev.Identity.Key(),
			"allow", ev.Decision.Allow, "code", ev.Outcome.Error, "err", err)
	}
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
