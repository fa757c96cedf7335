package redisconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/sandgate/sandgate/internal/breaker"
	"github.com/sandgate/sandgate/internal/config"
)

// ErrUnavailable is wrapped by every error of a Redis call that failed for want of Redis (it did
// not answer in time, refused the connection, or the breaker skipped the call), as opposed to an
// answer Redis gave. Logs of such errors are rate-limited (see telemetry.ThrottledHandler).
var ErrUnavailable = errors.New("redis unavailable")

// errSkipped is what a call the open breaker skipped returns, at once.
var errSkipped = fmt.Errorf("%w: skipped, the breaker is open after failures", ErrUnavailable)

// Guard is the circuit breaker in front of a client: every command and pipeline asks it first,
// so that once Redis is known to be down a call costs nothing instead of op_timeout, and its
// outcome (answered, or failed for want of Redis) moves the breaker. Calls made with a context
// from Unguarded (readiness, background loops) always go to Redis, and their outcome counts too:
// a readiness ping that is answered closes the breaker.
type Guard struct {
	b       *breaker.Breaker
	skipped metric.Int64Counter
}

type unguardedKey struct{}

// admittedKey marks the context of a call the guard let through: go-redis runs a new
// connection's handshake (HELLO, AUTH, SELECT) through the same hooks, and those commands belong
// to the call, not to the breaker. Without it a half-open probe that needs a new connection
// would have its handshake skipped, fail, and keep the breaker open for good.
type admittedKey struct{}

// Unguarded returns ctx marked so that its Redis calls bypass the breaker.
func Unguarded(ctx context.Context) context.Context {
	return context.WithValue(ctx, unguardedKey{}, true)
}

// NewGuard puts a breaker configured by cfg in front of client, with its state as the gauge
// sandgate.redis.breaker.state (0 closed, 1 open, 2 half-open) and the calls it skipped as
// sandgate.redis.breaker.skipped. Transitions are logged to log. mp and log may be nil.
func NewGuard(client redis.UniversalClient, cfg config.RedisBreaker, mp metric.MeterProvider, log *slog.Logger) (*Guard, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Guard{}
	g.b = breaker.New(breaker.Config{Failures: cfg.Failures, OpenFor: cfg.OpenFor.D()},
		breaker.OnChange(func(from, to breaker.State) {
			switch to {
			case breaker.Open:
				log.Warn("redis breaker open: request-path calls skip redis for a while", "from", from.String(), "open_for", cfg.OpenFor.D().String())
			case breaker.Closed:
				log.Info("redis breaker closed: redis answers again", "from", from.String())
			}
		}))
	m := mp.Meter("github.com/sandgate/sandgate/internal/redisconn")
	var err error
	if g.skipped, err = m.Int64Counter("sandgate.redis.breaker.skipped",
		metric.WithDescription("Redis calls the open breaker skipped (each failed at once)")); err != nil {
		return nil, fmt.Errorf("redis breaker metrics: %w", err)
	}
	if _, err = m.Int64ObservableGauge("sandgate.redis.breaker.state",
		metric.WithDescription("State of the breaker in front of Redis: 0 closed, 1 open, 2 half-open"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(g.b.State()))
			return nil
		})); err != nil {
		return nil, fmt.Errorf("redis breaker metrics: %w", err)
	}
	client.AddHook(g)
	return g, nil
}

// State is the breaker's state.
func (g *Guard) State() breaker.State { return g.b.State() }

// DialHook implements redis.Hook: dials happen inside a command, which the breaker already saw.
func (g *Guard) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (g *Guard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Value(admittedKey{}) != nil {
			return next(ctx, cmd)
		}
		if err := g.allow(ctx); err != nil {
			return err
		}
		return g.observe(ctx, next(context.WithValue(ctx, admittedKey{}, true), cmd))
	}
}

// ProcessPipelineHook implements redis.Hook.
func (g *Guard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Value(admittedKey{}) != nil {
			return next(ctx, cmds)
		}
		if err := g.allow(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		err := next(context.WithValue(ctx, admittedKey{}, true), cmds)
		if err == nil {
			for _, c := range cmds { // a pipeline returns the first command's error, if any
				if err = c.Err(); err != nil {
					break
				}
			}
		}
		return g.observe(ctx, err)
	}
}

func (g *Guard) allow(ctx context.Context) error {
	if ctx.Value(unguardedKey{}) != nil || g.b.Allow() {
		return nil
	}
	g.skipped.Add(ctx, 1)
	return errSkipped
}

// observe reports err's outcome to the breaker and returns it, marked with ErrUnavailable when
// it is Redis's absence rather than its answer.
func (g *Guard) observe(ctx context.Context, err error) error {
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		g.b.Success()
		return err
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return err // the caller gave up: that says nothing about Redis
	case answered(err):
		g.b.Success()
		return err
	}
	g.b.Failure()
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// answered reports whether err is an error reply of a Redis that works (a script error, a
// wrong type), not one that says it cannot serve (loading its data, no primary, cluster down).
func answered(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	for _, down := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"} {
		if strings.HasPrefix(re.Error(), down) {
			return false
		}
	}
	return true
}
