package admission

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/limits"
	"github.com/sandgate/sandgate/policy"
)

// Admission counts calls and fills in usage and grants. It is safe for concurrent use.
type Admission struct {
	limits *limits.Limiter
	grants grants.Store
	log    *slog.Logger
	denied metric.Int64Counter
	errors metric.Int64Counter
}

// New returns an Admission over l and g; either may be nil (nothing counted, no grants). mp and
// log may be nil.
func New(l *limits.Limiter, g grants.Store, log *slog.Logger, mp metric.MeterProvider) (*Admission, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/sandgate/sandgate/internal/admission")
	denied, err := m.Int64Counter("sandgate.limits.denied",
		metric.WithDescription("Calls refused by budgets and rate limits, by kind and code"))
	if err != nil {
		return nil, fmt.Errorf("admission metrics: %w", err)
	}
	errs, err := m.Int64Counter("sandgate.shared_state.errors",
		metric.WithDescription("Failed reads and writes of the shared state (limits, grants), by store"))
	if err != nil {
		return nil, fmt.Errorf("admission metrics: %w", err)
	}
	return &Admission{limits: l, grants: g, log: log, denied: denied, errors: errs}, nil
}

// Counting records, for one call, whether the limits could not count it. A call carries one
// in its context (WithCounting); the admission steps mark it when the limits store failed and the
// call went on anyway (fail_open), and the call's event then says limits "unavailable".
type Counting struct{ uncounted atomic.Bool }

// Uncounted reports whether a step of the call was admitted without being counted.
func (c *Counting) Uncounted() bool { return c != nil && c.uncounted.Load() }

type countingKey struct{}

// WithCounting returns ctx carrying c.
func WithCounting(ctx context.Context, c *Counting) context.Context {
	return context.WithValue(ctx, countingKey{}, c)
}

// markUncounted marks ctx's call as admitted uncounted (a verdict that allowed despite err).
func markUncounted(ctx context.Context) {
	if c, _ := ctx.Value(countingKey{}).(*Counting); c != nil {
		c.uncounted.Store(true)
	}
}

// Refusal is a call a limit refused, or that could not be counted because the limits store is
// unreachable and the failure mode is fail_closed. Code is the limit's bounded code
// (limits.CodeRateLimited, limits.CodeStoreUnavailable …).
type Refusal struct {
	Code   limits.Code
	Reason string
	// RetryAfter is how long the caller should wait before trying again, when the limit says.
	RetryAfter time.Duration
}

// Admit counts one call of in.Identity (limits.Limiter.Take) and sets in.Usage and in.Grants.
// It returns the refusal to act on when a limit refuses the call, or when the limits store cannot
// be reached and the failure mode is fail_closed; nil otherwise. Grants that cannot be read are
// left out (logged and counted): whatever needs a grant is then denied by policy.
//
// Callers the identity source does not know are neither counted nor given grants: policy
// refuses them by identity.
func (a *Admission) Admit(ctx context.Context, in *policy.Input) *Refusal {
	if a == nil || !in.Identity.Known {
		return nil
	}
	if a.limits != nil {
		usage, v, err := a.limits.Take(ctx, limits.KeysFor(in.Identity))
		if err != nil {
			a.limitsError(ctx, in.Identity, v, err)
		}
		if !v.Allowed {
			return a.deny(ctx, in.Kind, v)
		}
		in.Usage = usage
	}
	if a.grants != nil {
		g, err := a.grantsOf(ctx, in.Identity)
		if err != nil {
			a.storeError(ctx, "grants", in.Identity, err)
		} else {
			in.Grants = g
		}
	}
	return nil
}

// grantsOf returns the grants of the caller's claim (Identity.Claim, set only when the claim is
// verifiably bound to this sandbox) with those of the sandbox itself over them.
func (a *Admission) grantsOf(ctx context.Context, id identity.Identity) (map[string]any, error) {
	own, err := a.grants.Get(ctx, id.Key())
	if err != nil || id.Claim == "" {
		return own, err
	}
	claimed, err := a.grants.Get(ctx, grants.ClaimKey(id.Namespace, id.Claim))
	if err != nil {
		return nil, err
	}
	for k, v := range own {
		claimed[k] = v
	}
	return claimed, nil
}

// AcquireToolCall takes one of the caller's concurrent tool call slots. release is never nil and
// must be called when the call ends; deny is the refusal to act on when no slot is free (or the
// store cannot be reached and the mode is fail_closed).
func (a *Admission) AcquireToolCall(ctx context.Context, id identity.Identity) (release func(), deny *Refusal) {
	if a == nil || a.limits == nil || !id.Known {
		return func() {}, nil
	}
	release, v, err := a.limits.Acquire(ctx, limits.KeysFor(id))
	if err != nil {
		a.limitsError(ctx, id, v, err)
	}
	if !v.Allowed {
		release()
		return func() {}, a.deny(ctx, audit.KindToolsCall, v)
	}
	return release, nil
}

// AddTokens charges n model tokens to the caller's daily budgets. It returns the verdict to act
// on: when it is not Allowed the budget is spent (or cannot be checked, fail_closed) and a
// streaming response should end after its current event.
func (a *Admission) AddTokens(ctx context.Context, id identity.Identity, n int64) limits.Verdict {
	if a == nil || a.limits == nil || !id.Known || n <= 0 {
		return limits.Verdict{Allowed: true}
	}
	v, err := a.limits.AddTokens(ctx, limits.KeysFor(id), n)
	if err != nil {
		a.limitsError(ctx, id, v, err)
	}
	if !v.Allowed {
		a.denied.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", string(audit.KindHTTPRequest)), attribute.String("code", string(v.Code))))
	}
	return v
}

func (a *Admission) deny(ctx context.Context, kind audit.Kind, v limits.Verdict) *Refusal {
	a.denied.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", string(kind)), attribute.String("code", string(v.Code))))
	return &Refusal{Code: v.Code, Reason: v.Reason, RetryAfter: v.RetryAfter}
}

// limitsError logs and counts a limits store failure, and marks the call uncounted when the
// verdict let it go on regardless (fail_open).
func (a *Admission) limitsError(ctx context.Context, id identity.Identity, v limits.Verdict, err error) {
	a.storeError(ctx, "limits", id, err)
	if v.Allowed {
		markUncounted(ctx)
	}
}

func (a *Admission) storeError(ctx context.Context, store string, id identity.Identity, err error) {
	a.errors.Add(ctx, 1, metric.WithAttributes(attribute.String("store", store)))
	a.log.Warn("shared state unavailable", "store", store, "sandbox", id.Key(), "err", err)
}
