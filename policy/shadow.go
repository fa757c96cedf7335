package policy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sandgate/sandgate/internal/telemetry"
)

// ShadowPath is the path of a shadow decision in the decision log; replay and
// `policy eval --decision-id` read only DecisionPath events.
const ShadowPath = "sandgate/shadow"

// ShadowConfig configures a Shadow. Zero values take the defaults.
type ShadowConfig struct {
	// QueueSize bounds the decisions waiting for the shadow policy (default 1024); Submit drops
	// and counts what does not fit.
	QueueSize int
	// Workers evaluate the queue (default 2).
	Workers int
	// Decisions, if set, receives every divergence (path ShadowPath), whether or not it was
	// in time for the call's audit event.
	Decisions *DecisionLog
	// Meters receives sandgate.policy.shadow.* counters.
	Meters metric.MeterProvider
	Log    *slog.Logger
}

// Shadow evaluates a second policy (a candidate) beside the enforced one, off the request
// path: Submit hands the call's input to a bounded queue and returns at once; workers evaluate
// it under the shadow engine. The shadow decision never changes the call's outcome.
//
// A divergence is a shadow decision whose allow or code differs from the enforced one. It is
// counted (sandgate.policy.shadow.divergences by kind, allow and code) and written to the
// decision log. The call's audit event carries it only when the shadow finished before the
// event was written: the event is never held back for it. A divergence found after that is
// counted as late (sandgate.policy.shadow.late) and is in the decision log only.
type Shadow struct {
	engine *Engine
	cfg    ShadowConfig
	queue  chan *ShadowPending

	dropped, evaluated, diverged, late atomic.Uint64

	metrics shadowMetrics
}

type shadowMetrics struct {
	divergences, dropped, late metric.Int64Counter
	codes                      *telemetry.LabelSet
}

// ShadowDecision is what the shadow policy decided where it differs from the enforced policy.
type ShadowDecision struct {
	Allow    bool
	Reason   string
	Code     string
	Revision string
}

// Pending states.
const (
	pendingQueued int32 = iota
	pendingDone
	pendingCollected // the event was written: a result found after this is late
)

// ShadowPending is one call's shadow evaluation.
type ShadowPending struct {
	id       string
	in       Input
	enforced Decision
	state    atomic.Int32
	result   *ShadowDecision // set before state becomes pendingDone; nil: no divergence
	done     chan struct{}
}

// NewShadow evaluates submitted calls under engine once Run is running.
func NewShadow(engine *Engine, cfg ShadowConfig) *Shadow {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.Meters == nil {
		cfg.Meters = noop.NewMeterProvider()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Shadow{engine: engine, cfg: cfg, queue: make(chan *ShadowPending, cfg.QueueSize)}
	m := cfg.Meters.Meter("github.com/sandgate/sandgate/policy")
	s.metrics.codes = newCodeLabels()
	s.metrics.divergences, _ = m.Int64Counter("sandgate.policy.shadow.divergences",
		metric.WithDescription("Shadow policy decisions that differ from the enforced one, by kind, shadow allow and shadow code."))
	s.metrics.dropped, _ = m.Int64Counter("sandgate.policy.shadow.dropped",
		metric.WithDescription("Calls not evaluated under the shadow policy: its queue was full."))
	s.metrics.late, _ = m.Int64Counter("sandgate.policy.shadow.late",
		metric.WithDescription("Divergences found after the call's audit event was written (in the decision log only)."))
	return s
}

// Engine is the shadow policy's engine (its revision, status and watch).
func (s *Shadow) Engine() *Engine { return s.engine }

// Submit queues the call's input for the shadow policy, with the enforced decision to compare
// with. in is copied (shallowly, as the decision log does: the caller must not change it after
// the decision). It never blocks; nil means the queue was full and the call was dropped.
func (s *Shadow) Submit(id string, in *Input, enforced Decision) *ShadowPending {
	p := &ShadowPending{id: id, in: *in, enforced: enforced, done: make(chan struct{})}
	select {
	case s.queue <- p:
		return p
	default:
		s.dropped.Add(1)
		s.metrics.dropped.Add(context.Background(), 1)
		return nil
	}
}

// Run evaluates the queue until ctx ends.
func (s *Shadow) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range s.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case p := <-s.queue:
					s.evaluate(ctx, p)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

func (s *Shadow) evaluate(ctx context.Context, p *ShadowPending) {
	// Not cancelled with Run's context: a call taken off the queue as the process stops must
	// not be "denied as abandoned" and counted as a divergence. Evaluation is bounded anyway.
	d := s.engine.Decide(context.WithoutCancel(ctx), &p.in)
	s.evaluated.Add(1)
	if d.Allow != p.enforced.Allow || d.Code != p.enforced.Code {
		p.result = &ShadowDecision{Allow: d.Allow, Reason: d.Reason, Code: d.Code, Revision: d.Revision}
		s.diverged.Add(1)
		s.metrics.divergences.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", string(p.in.Kind)),
			attribute.Bool("allow", d.Allow), attribute.String("code", s.metrics.codes.Value(d.Code))))
		if s.cfg.Decisions != nil {
			s.cfg.Decisions.record(p.id, ShadowPath, &p.in, d)
		}
	}
	if !p.state.CompareAndSwap(pendingQueued, pendingDone) && p.result != nil {
		s.late.Add(1)
		s.metrics.late.Add(ctx, 1)
	}
	close(p.done)
}

// Collect is called when the call's audit event is written: it returns the divergence if the
// shadow has finished and found one, and never waits. After Collect, a divergence the shadow
// finds is counted as late.
func (p *ShadowPending) Collect() *ShadowDecision {
	if p == nil {
		return nil
	}
	if p.state.CompareAndSwap(pendingQueued, pendingCollected) {
		return nil
	}
	return p.result
}

// Done is closed when the shadow has evaluated the call (tests wait on it; the request path
// never does).
func (p *ShadowPending) Done() <-chan struct{} { return p.done }

// ShadowCounts are the Shadow's running totals.
type ShadowCounts struct {
	Evaluated, Diverged, Late, Dropped uint64
}

// Counts reports the totals so far.
func (s *Shadow) Counts() ShadowCounts {
	return ShadowCounts{Evaluated: s.evaluated.Load(), Diverged: s.diverged.Load(), Late: s.late.Load(), Dropped: s.dropped.Load()}
}

// errNoShadow is returned by NewShadowEngine for a folder with no policy (the shadow then
// diverges on every call with no_policy, which is noise, not a candidate).
var errNoShadow = errors.New("the shadow policy folder holds no policy")

// NewShadowEngine loads the shadow policy folder like the enforced one (hot reload by Watch),
// but refuses a folder that holds no policy.
func NewShadowEngine(ctx context.Context, dir string, opts ...Option) (*Engine, error) {
	e, err := New(ctx, dir, opts...)
	if err != nil {
		return nil, err
	}
	if e.Revision() == noRevision {
		return nil, errNoShadow
	}
	return e, nil
}
