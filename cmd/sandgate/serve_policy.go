package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/telemetry"
	"github.com/sandgate/sandgate/policy"
)

// policySide is the policy half of serve: the enforced engine, the shadow engine if a shadow
// policy is configured, and the loops that keep them current.
type policySide struct {
	engine *policy.Engine
	shadow *policy.Engine // nil: no shadow policy
	loops  []component    // folder watches or bundle polling
}

// newPolicySide loads the enforced policy (policy.dir, or policy.bundle) and the shadow policy.
func newPolicySide(ctx context.Context, cfg *config.Config, log *slog.Logger, tel *telemetry.Telemetry, ready *readiness) (*policySide, error) {
	ps := &policySide{}
	var err error
	if cfg.Policy.Bundle.Configured() {
		ps.engine, ps.loops, err = newBundleEngine(ctx, cfg, log, tel)
	} else {
		ps.engine, err = newPolicyEngine(ctx, cfg, log, tel)
		if err == nil && cfg.Policy.WatchEnabled() {
			ps.loops = append(ps.loops, componentFunc(ps.engine.Watch))
		}
	}
	if err != nil {
		return nil, err
	}
	engine := ps.engine
	ready.Add("policy", func() error {
		if engine.Revision() == "none" {
			return errors.New("no policy loaded")
		}
		return nil
	})
	ready.AddDegraded("policy", degradedCheck(engine))
	if dir := cfg.Policy.Shadow.Dir; dir != "" {
		// No meter provider: the shadow's decisions must not count as enforced decisions.
		ps.shadow, err = policy.NewShadowEngine(ctx, dir, policy.WithLogger(log.With("component", "shadow_policy")),
			policy.WithDecisionCache(cfg.Policy.DecisionCacheEntries()), policy.WithPollInterval(cfg.Policy.PollInterval.D()))
		if err != nil {
			return nil, fmt.Errorf("policy.shadow.dir: %w", err)
		}
		if cfg.Policy.WatchEnabled() {
			ps.loops = append(ps.loops, componentFunc(ps.shadow.Watch))
		}
		ready.AddDegraded("shadow policy", degradedCheck(ps.shadow))
		log.Info("shadow policy loaded", "dir", dir, "revision", ps.shadow.Revision())
	}
	return ps, nil
}

// degradedCheck reports an engine serving its last good revision after a failed reload (or a
// broken watch, or a refused bundle): degraded, not a failing check.
func degradedCheck(e *policy.Engine) func() error {
	return func() error {
		if s := e.Status(); s.Degraded() {
			return errors.New(s.Problem())
		}
		return nil
	}
}

// newPolicyEngine loads the policy folder. A reload or watch that fails leaves the last good
// revision serving, so readiness reports it as degraded, not as a failing check.
func newPolicyEngine(ctx context.Context, cfg *config.Config, log *slog.Logger, tel *telemetry.Telemetry) (*policy.Engine, error) {
	return policy.New(ctx, cfg.Policy.Dir,
		policy.WithLogger(log.With("component", "policy")),
		policy.WithDecisionCache(cfg.Policy.DecisionCacheEntries()),
		policy.WithPollInterval(cfg.Policy.PollInterval.D()),
		policy.WithMeterProvider(tel.MeterProvider()))
}

// openDecisionLog opens policy.decision_log when a file or an upload URL is configured, else
// returns nil.
func openDecisionLog(cfg *config.Config, replica string, log *slog.Logger, tel *telemetry.Telemetry) (*policy.DecisionLog, error) {
	c := cfg.Policy.DecisionLog
	if c.File == "" && c.HTTP.URL == "" {
		return nil, nil
	}
	dc := policy.DecisionLogConfig{File: c.File, MaxSize: int64(c.MaxSizeMB) << 20,
		MaxFiles: c.MaxFiles, Mask: c.Mask, Labels: map[string]string{"id": replica, "version": version},
		Meters: tel.MeterProvider(), Log: log.With("component", "decision_log")}
	if h := c.HTTP; h.URL != "" {
		dc.HTTP = &policy.DecisionLogHTTP{URL: h.URL, MaxBatch: h.MaxBatch, FlushInterval: h.FlushInterval.D(),
			QueueSize: h.QueueSize, MaxRetries: h.MaxRetries}
	}
	dl, err := policy.OpenDecisionLog(dc)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return dl, nil
}

// bundleConfig reads policy.bundle's key file into the engine's bundle configuration.
func bundleConfig(cfg *config.Config) (policy.BundleConfig, error) {
	b := cfg.Policy.Bundle
	key, err := os.ReadFile(b.PublicKeyFile)
	if err != nil {
		return policy.BundleConfig{}, fmt.Errorf("policy.bundle.public_key_file: %w", err)
	}
	return policy.BundleConfig{File: b.File, URL: b.URL, OCI: b.OCI, OCIPlainHTTP: b.OCIPlainHTTP,
		PublicKey: string(key), KeyID: b.KeyID, Algorithm: b.Algorithm, Scope: b.Scope,
		PollInterval: b.PollInterval.D()}, nil
}

// newBundleEngine loads policy.bundle and returns the loop that polls it. policy.watch does
// not apply: a bundle is polled every policy.bundle.poll_interval.
func newBundleEngine(ctx context.Context, cfg *config.Config, log *slog.Logger, tel *telemetry.Telemetry) (*policy.Engine, []component, error) {
	bc, err := bundleConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	engine, src, err := policy.NewBundleEngine(ctx, bc,
		policy.WithLogger(log.With("component", "policy")),
		policy.WithDecisionCache(cfg.Policy.DecisionCacheEntries()),
		policy.WithMeterProvider(tel.MeterProvider()))
	if err != nil {
		return nil, nil, fmt.Errorf("policy.bundle: %w", err)
	}
	return engine, []component{componentFunc(src.Run)}, nil
}
