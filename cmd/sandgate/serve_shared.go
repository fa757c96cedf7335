package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/gateway"
	"github.com/sandgate/sandgate/internal/admission"
	"github.com/sandgate/sandgate/internal/catalogs"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/internal/limits"
	"github.com/sandgate/sandgate/internal/mcpsessions"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/internal/telemetry"
)

// sharedState is what replicas share through Redis when it is configured, else its in-memory
// stand-ins: budget counters, grants, and the audit stream mirror (nil without Redis).
type sharedState struct {
	limits *limits.Limiter
	grants grants.Store
	// sessions shares MCP sessions between replicas (nil without Redis: they stay local).
	sessions mcpsessions.Store
	client   redis.UniversalClient // nil without Redis
	mirror   *audit.StreamMirror   // nil unless the audit stream is enabled
}

// newSharedState connects to Redis when configured (lazily: go-redis dials on first use, so a
// Redis that is down at start delays nothing) and builds the stores on it.
//
// Redis trouble never makes a replica unready: budgets then fail closed (or open, as
// configured), grants are left out of the policy input (denying what needs one), and the audit
// file keeps every event while the mirror catches up later. Taking every replica out of service
// because the shared Redis is down would turn a degraded gateway into no gateway at all, so the
// Redis check is reported under "degraded" by /readyz, not under "failing".
//
// Every request-path Redis call runs under a deadline of redis.op_timeout, dial and pool wait
// included, behind a breaker (redisconn.Guard) that skips Redis for redis.breaker.open_for once
// it failed. Readiness and the audit stream mirror bypass the breaker: an answered readiness
// ping closes it.
//
// now, when set, is the budgets' clock (tests pin it).
func newSharedState(cfg *config.Config, creds *credential.Store, replica string, log *slog.Logger, mp metric.MeterProvider, ready *readiness, now func() time.Time) (*sharedState, error) {
	rc := cfg.Redis
	var clock []limits.Option
	if now != nil {
		clock = append(clock, limits.WithClock(now))
	}
	if !rc.Enabled() {
		return &sharedState{limits: limits.NewMemory(cfg.Limits, clock...), grants: grants.NewMemory()}, nil
	}
	client, err := redisClient(rc, creds)
	if err != nil {
		return nil, err
	}
	if _, err := redisconn.NewGuard(client, rc.Breaker, mp, log.With("component", "redis")); err != nil {
		_ = client.Close()
		return nil, err
	}
	s := &sharedState{
		client:   client,
		limits:   limits.NewRedis(client, rc.KeyPrefix, cfg.Limits, append(clock, limits.WithTimeout(rc.OpTimeout.D()))...),
		grants:   grants.NewRedis(client, rc.KeyPrefix, grants.WithTimeout(rc.OpTimeout.D())),
		sessions: mcpsessions.NewRedis(client, rc.KeyPrefix, rc.OpTimeout.D()),
	}
	ready.AddDegraded("redis", func() error {
		ctx, cancel := context.WithTimeout(redisconn.Unguarded(context.Background()), rc.OpTimeout.D())
		defer cancel()
		return redisconn.Check(ctx, client)
	})
	if rc.AuditStreamEnabled() {
		m, err := audit.NewStreamMirror(client, audit.StreamConfig{
			Dir: cfg.Audit.File.Dir, Stream: rc.AuditStream.Name, Source: replica, MaxLen: rc.AuditStream.MaxLen})
		if err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("redis.audit_stream: %w", err)
		}
		s.mirror = m
		ready.AddDegraded("audit stream mirror", m.Healthy)
	}
	log.Info("shared state in redis", "topology", rc.Topology(), "addr", rc.Addr, "key_prefix", rc.KeyPrefix, "audit_stream", rc.AuditStreamEnabled(), "replica", replica)
	return s, nil
}

// redisClient builds the client of rc's topology with the passwords its credentials hold.
func redisClient(rc config.Redis, creds *credential.Store) (redis.UniversalClient, error) {
	var pw redisconn.Passwords
	for _, ref := range []struct {
		field, name string
		value       *string
	}{
		{"redis.password_credential", rc.PasswordCredential, &pw.Redis},
		{"redis.sentinel.password_credential", sentinelCredential(rc), &pw.Sentinel},
	} {
		if ref.name == "" {
			continue
		}
		v, ok := creds.Get(ref.name)
		if !ok {
			return nil, fmt.Errorf("%s: credential %q is not available", ref.field, ref.name)
		}
		*ref.value = v
	}
	return redisconn.New(rc, pw)
}

func sentinelCredential(rc config.Redis) string {
	if rc.Sentinel == nil {
		return ""
	}
	return rc.Sentinel.PasswordCredential
}

// catalogs keeps the gateway upstreams' last known catalogs: shared in Redis when it is
// configured, else in a file beside the audit log.
func (s *sharedState) catalogs(cfg *config.Config) gateway.CatalogStore {
	if s.client != nil {
		return catalogs.NewRedis(s.client, cfg.Redis.KeyPrefix, cfg.Redis.OpTimeout.D())
	}
	return catalogs.NewFile(filepath.Join(cfg.Audit.File.Dir, catalogs.FileName))
}

// admission is the request path's view of the shared state (gateway and proxy use the same).
func (s *sharedState) admission(d *serveDeps) (*admission.Admission, error) {
	return admission.New(s.limits, s.grants, d.log.With("component", "admission"), d.meters)
}

// components are the background loops of the shared state: the audit stream mirror.
func (s *sharedState) components() []component {
	if s.mirror == nil {
		return nil
	}
	return []component{componentFunc(func(ctx context.Context) error {
		_ = s.mirror.Run(redisconn.Unguarded(ctx)) // returns ctx's error: a normal stop
		return nil
	})}
}

// sync mirrors what the audit writer flushed last (call after the writer is closed), within ctx.
func (s *sharedState) sync(ctx context.Context, log *slog.Logger) {
	if s.mirror == nil {
		return
	}
	if err := s.mirror.Sync(redisconn.Unguarded(ctx)); err != nil {
		log.Warn("audit stream not fully mirrored on shutdown; the next start catches up from the file", "err", err)
	}
	_ = s.mirror.Release(redisconn.Unguarded(ctx)) // else a replica of this name waits for it to run out
}

// close disconnects from Redis.
func (s *sharedState) close() {
	if s.client != nil {
		_ = s.client.Close()
	}
}

// sandboxGone drops a deleted sandbox's grants (their TTL would remove them too, later).
func (s *sharedState) sandboxGone(log *slog.Logger) func(key string) {
	return func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.grants.DeleteSandbox(ctx, key); err != nil {
			log.Warn("grants of deleted sandbox not removed; they expire with their TTL", "sandbox", key, "err", err)
		}
	}
}

// redisLogger routes go-redis's own log lines (reconnects, pool trouble) through slog, one line
// per format and throttle period: during an outage go-redis says the same thing on every dial.
type redisLogger struct {
	log      *slog.Logger
	throttle *telemetry.Throttle
}

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	ok, suppressed := l.throttle.Allow(format)
	if !ok {
		return
	}
	if suppressed > 0 {
		l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "suppressed", suppressed)
		return
	}
	l.log.WarnContext(ctx, fmt.Sprintf(format, v...))
}
