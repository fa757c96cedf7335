package credential

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// EventKind is what happened to a minted token.
type EventKind string

// Kinds of lifecycle events: each is an audit event of its own (credential.mint …).
const (
	EventMint    EventKind = "mint"
	EventRefresh EventKind = "refresh"
	EventRevoke  EventKind = "revoke"
)

// Event is one mint, refresh or revocation of a run's token. It names the token by its ID,
// never by its value.
type Event struct {
	Kind       EventKind
	Credential string
	Provider   string
	Run        Run
	TokenID    string
	Expires    time.Time
	// Failed says the mint or the revocation failed; Reason says why (a revocation's reason
	// is why the run's token ended).
	Failed   bool
	Reason   string
	Duration time.Duration
}

// Recorder writes lifecycle events (the request path's Core: the audit log). It must not block
// for long: it runs on the minting goroutines.
type Recorder interface {
	CredentialEvent(Event)
}

// Results of the mint and revocation metrics (a closed set).
const (
	resultOK          = "ok"
	resultError       = "error"
	resultUnsupported = "unsupported" // the provider cannot revoke: the token was forgotten
)

// lifecycle records events and metrics of minted tokens.
type lifecycle struct {
	rec     Recorder
	log     *slog.Logger
	mints   metric.Int64Counter
	revokes metric.Int64Counter
	latency metric.Float64Histogram
}

func newLifecycle(rec Recorder, mp metric.MeterProvider, log *slog.Logger) (*lifecycle, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/sandgate/sandgate/internal/credential")
	l := &lifecycle{rec: rec, log: log}
	var err error
	if l.mints, err = m.Int64Counter("sandgate.credential.mints",
		metric.WithDescription("Tokens minted per sandbox run (first mints and refreshes), by credential, provider and result")); err != nil {
		return nil, fmt.Errorf("credential metrics: %w", err)
	}
	if l.revokes, err = m.Int64Counter("sandgate.credential.revocations",
		metric.WithDescription("Tokens of ended runs revoked at their provider, by credential, provider and result (unsupported: forgotten, left to expire)")); err != nil {
		return nil, fmt.Errorf("credential metrics: %w", err)
	}
	if l.latency, err = m.Float64Histogram("sandgate.credential.mint.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a provider took to mint a token, by credential, provider and result"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)); err != nil {
		return nil, fmt.Errorf("credential metrics: %w", err)
	}
	return l, nil
}

func attrs(credential, provider, result string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("credential", credential), attribute.String("provider", provider),
		attribute.String("result", result))
}

// minted records a mint or refresh of e: l is the token, reason why it failed ("" it did not).
func (lc *lifecycle) minted(e *entry, provider string, l Lease, refresh bool, reason string, took time.Duration) {
	ev := Event{Kind: EventMint, Credential: e.name, Provider: provider, Run: e.run, TokenID: l.ID, Expires: l.Expires,
		Failed: reason != "", Reason: reason, Duration: took}
	if refresh {
		ev.Kind = EventRefresh
	}
	result := resultOK
	if ev.Failed {
		result = resultError
		lc.log.Warn("minting a credential failed", "credential", e.name, "provider", provider, "run", e.run.Key, "reason", reason)
	}
	a := attrs(e.name, provider, result)
	lc.mints.Add(context.Background(), 1, a)
	lc.latency.Record(context.Background(), took.Seconds(), a)
	if lc.rec != nil {
		lc.rec.CredentialEvent(ev)
	}
}

// revoked records the revocation of l, asked for reason; err is the provider's answer.
func (lc *lifecycle) revoked(e *entry, l Lease, reason string, err error) {
	ev := Event{Kind: EventRevoke, Credential: e.name, Provider: l.Provider, Run: e.run, TokenID: l.ID, Expires: l.Expires, Reason: reason}
	result := resultOK
	switch {
	case errors.Is(err, errNoRevocation):
		result = resultUnsupported
		ev.Reason = reason + "; forgotten (the provider cannot revoke: it expires at its time)"
	case err != nil:
		result = resultError
		ev.Failed = true
		ev.Reason = reason + "; revocation failed: " + endpointReason("provider", err).Error()
		lc.log.Warn("revoking a credential failed", "credential", e.name, "run", e.run.Key, "token_id", l.ID, "reason", ev.Reason)
	}
	lc.revokes.Add(context.Background(), 1, attrs(e.name, l.Provider, result))
	if lc.rec != nil {
		lc.rec.CredentialEvent(ev)
	}
}
