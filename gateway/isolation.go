package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/internal/breaker"
)

// How one upstream's failures stay its own (docs/mcp-gateway.md, "When an upstream fails"):
//   - an error the upstream answers to a call (a JSON-RPC error, a tool result with isError,
//     an HTTP error status, a body that is not JSON-RPC) fails that call only: the connection
//     and its upstream session stay, nothing is initialized again;
//   - a transport failure (connection refused, reset or closed before an answer) drops the
//     connection it happened on; the supervisor reconnects the shared one with exponential
//     backoff and jitter;
//   - each upstream has a circuit breaker (internal/breaker) counting consecutive transport
//     failures and timeouts of calls: open, the upstream's calls answer upstream_unavailable
//     at once (audited as such) instead of each waiting for call_timeout, so a hanging
//     upstream costs the sandboxes and the other upstreams nothing; after breaker.open_for one
//     probe call goes through and its outcome closes or reopens the breaker.

// outcome is what a call's end says about its upstream.
type outcome int

const (
	outcomeOK        outcome = iota // answered, with a result
	outcomeReply                    // answered, with an error: this call fails, the connection stays
	outcomeTransport                // the connection failed: dropped and reconnected
	outcomeTimeout                  // no answer within call_timeout
	outcomeNeutral                  // the sandbox gave up, or the call never reached the upstream
)

// classify tells what err, a call's error, says about the upstream. ctx is the sandbox's
// context, timedOut whether call_timeout ended the call, rp what HTTP answered.
func classify(ctx context.Context, err error, timedOut bool, rp *reply) outcome {
	switch {
	case err == nil:
		return outcomeOK
	case ctx.Err() != nil:
		return outcomeNeutral
	case timedOut:
		return outcomeTimeout
	case errors.Is(err, errUpstreamDown):
		return outcomeNeutral // the supervisor knows: the call did not try
	case rp.answered(err) || streamEndedEarly(err):
		return outcomeReply
	case isTransportError(err):
		return outcomeTransport
	default:
		return outcomeReply // a JSON-RPC error the upstream sent
	}
}

type replyKey struct{}

// reply is what HTTP answered to a call's requests: the last response status, 0 for none, and
// the bound or coding its answer was refused for (bounds.go).
type reply struct {
	status atomic.Int32
	bound  atomic.Pointer[error]
}

func withReply(ctx context.Context) (context.Context, *reply) {
	rp := &reply{}
	return context.WithValue(ctx, replyKey{}, rp), rp
}

// answered reports an error the upstream answered at the HTTP level: an error status (a 404
// that ends a session is handled before), or a success status whose body was not a JSON-RPC
// response.
func (rp *reply) answered(err error) bool {
	if rp == nil {
		return false
	}
	st := rp.status.Load()
	if st >= 300 {
		return true
	}
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return st >= 200 && (errors.As(err, &syntax) || errors.As(err, &typ) ||
		strings.Contains(err.Error(), "response has no result") || strings.Contains(err.Error(), "should contain RPC id"))
}

// replyTransport notes the status of every upstream HTTP response in its call's reply.
type replyTransport struct{ base http.RoundTripper }

func (t replyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if rp, ok := r.Context().Value(replyKey{}).(*reply); ok && err == nil {
		rp.status.Store(int32(resp.StatusCode))
	}
	return resp, err
}

// Breaker defaults of an upstream (breaker.failures, breaker.open_for).
const (
	defaultBreakerFailures = 5
	defaultBreakerOpenFor  = 10 * time.Second
)

// errBreakerOpen is returned for a call its upstream's open breaker refused.
var errBreakerOpen = errors.New("circuit breaker open")

// allow asks u's breaker whether a call may go to u now.
func (u *upstream) allow() error {
	if u.brk.Allow() {
		return nil
	}
	return fmt.Errorf("%w after %d consecutive transport failures or timeouts; one call probes it every %s",
		errBreakerOpen, u.cfg.Breaker.Failures, u.cfg.Breaker.OpenFor.D())
}

// breakerDone reports a call's outcome to the upstream's breaker. An outcome that says nothing
// about the upstream is not reported: a probe that ends so is given up after open_for.
func (u *upstream) breakerDone(o outcome) {
	switch o {
	case outcomeOK, outcomeReply:
		u.brk.Success()
	case outcomeTransport, outcomeTimeout:
		u.brk.Failure()
	}
}

// newBreaker is u's breaker (opts: a test's clock); its transitions are logged.
func (u *upstream) newBreaker(opts ...breaker.Option) *breaker.Breaker {
	cfg := breaker.Config{Failures: u.cfg.Breaker.Failures, OpenFor: u.cfg.Breaker.OpenFor.D()}
	return breaker.New(cfg, append(opts, breaker.OnChange(func(from, to breaker.State) {
		switch to {
		case breaker.Open:
			u.log.Warn("upstream circuit breaker open: its calls answer upstream_unavailable", "from", from.String(),
				"failures", cfg.Failures, "open_for", cfg.OpenFor)
		case breaker.Closed:
			u.log.Info("upstream circuit breaker closed", "from", from.String())
		}
	}))...)
}

// breakerHealth is nil unless u's breaker refuses calls.
func (u *upstream) breakerHealth() error {
	if s := u.brk.State(); s != breaker.Closed {
		return errors.New("upstream " + u.cfg.Name + ": circuit breaker " + s.String())
	}
	return nil
}

// jittered is backoff d with equal jitter: uniformly in [d/2, d), so that replicas (and
// upstreams) that lost their connections together do not retry in step.
func jittered(d time.Duration) time.Duration {
	if d < 2 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// registerBreakerMetric reports each upstream's breaker state: 0 closed, 1 open, 2 half-open.
func (g *Gateway) registerBreakerMetric(m metric.Meter) error {
	_, err := m.Int64ObservableGauge("sandgate.gateway.upstream.breaker",
		metric.WithDescription("Circuit breaker state per MCP upstream: 0 closed, 1 open, 2 half-open (probing)"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for _, u := range g.upstreams {
				o.Observe(int64(u.brk.State()), metric.WithAttributes(attribute.String("upstream", u.cfg.Name)))
			}
			return nil
		}))
	return err
}
