package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/proxy"
)

// checkConfig is `serve --check-config`: everything serve would refuse at start, short of
// binding the listeners and reaching Kubernetes or Redis. cfg has passed config.Load (fields,
// addresses, durations). Then the files it names (config.CheckFiles), the credentials' values
// (never printed), the Redis and OTLP TLS files (parsed), the proxy CA and the policies, compiled.
//
// offline checks a config rendered for a pod from outside it (docs/install.md): the credential
// files and variables, the CA, the policy folder and the pod's environment are not there, so
// only the fields and the audit folder are checked.
func checkConfig(ctx context.Context, env *cliEnv, path string, cfg *config.Config, offline bool) error {
	if err := cfg.CheckFiles(offline); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if offline {
		return nil
	}
	creds, err := credential.NewStore(cfg.Credentials, env.getenv, nil)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if _, err := auditWriterOptions(cfg, creds, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	if err := creds.EnableMinting(cfg, credential.MintOptions{}); err != nil { // the run tokens' key
		return fmt.Errorf("config %s: %w", path, err)
	}
	if _, err := memoryLimitFromEnv(env.getenv); err != nil {
		return err
	}
	if _, err := redisconn.TLSConfig(cfg.Redis.TLS); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if cfg.Audit.OTLP.On() {
		if _, err := otlpConfig(cfg, creds, "", env.getenv); err != nil {
			return fmt.Errorf("config %s: %w", path, err)
		}
	}
	if cfg.Proxy.CA.Cert != "" {
		if _, err := proxy.LoadCA(cfg.Proxy.CA.Cert, cfg.Proxy.CA.Key); err != nil {
			return fmt.Errorf("config %s: proxy.ca: %w", path, err)
		}
	}
	if err := checkPolicies(ctx, cfg); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// reportCheck prints the verdict of checkConfig (err nil: valid) as text or JSON and returns the
// error that sets the exit code.
func reportCheck(env *cliEnv, path string, offline bool, output string, err error) error {
	if output == "json" {
		return writeCheckJSON(env.stdout, path, offline, err)
	}
	if err != nil {
		return err
	}
	if offline {
		fmt.Fprintf(env.stdout, "config %s is valid (offline: credentials, CA and policies not checked)\n", path)
		return nil
	}
	fmt.Fprintf(env.stdout, "config %s is valid\n", path)
	return nil
}

// checkPolicies compiles policy.dir, or reads policy.bundle's key and, for a file bundle, loads
// and verifies it (a remote bundle is not fetched), and compiles policy.shadow.dir.
func checkPolicies(ctx context.Context, cfg *config.Config) error {
	if cfg.Policy.Bundle.Configured() {
		bc, err := bundleConfig(cfg)
		if err != nil {
			return err
		}
		if bc.File != "" {
			if _, _, err := policy.NewBundleEngine(ctx, bc); err != nil {
				return fmt.Errorf("policy.bundle: %w", err)
			}
		}
	} else {
		eng, err := policy.New(ctx, cfg.Policy.Dir)
		if err != nil {
			return err
		}
		// serve starts on an empty folder (a policy may be written into it later) but denies
		// everything and is never ready until then: not a valid config for a start.
		if errors.Is(eng.Status().ReloadErr, policy.ErrNoPolicy) {
			return fmt.Errorf("policy.dir: %s holds no .rego policy file; serve would deny every call and never become ready", cfg.Policy.Dir)
		}
	}
	if dir := cfg.Policy.Shadow.Dir; dir != "" {
		if _, err := policy.NewShadowEngine(ctx, dir); err != nil {
			return fmt.Errorf("policy.shadow.dir: %w", err)
		}
	}
	return nil
}
