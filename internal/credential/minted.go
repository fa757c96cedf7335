package credential

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
)

// MintOptions are what minted credentials need besides the config.
type MintOptions struct {
	// HTTP sends the requests to providers (default: a client that follows no redirect).
	HTTP *http.Client
	// Recorder writes the lifecycle events (the audit log); Meters the metrics.
	Recorder Recorder
	Meters   metric.MeterProvider
	// Now is the clock tokens' lifetimes are measured on (tests set it).
	Now func() time.Time
}

// destinations maps what a call is aimed at to the minted credential configured for it.
type destinations struct {
	upstreams, routes, hosts map[string]string
}

// EnableMinting sets up the minted credentials of cfg (those with a provider). The static
// credentials they name (client secrets, keys) must be in the store. Without any minted
// credential it does nothing.
func (s *Store) EnableMinting(cfg *config.Config, o MintOptions) error {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HTTP == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = 30 * time.Second
		o.HTTP = &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if rt := cfg.RunTokens; rt != nil {
		key, ok := s.Get(rt.KeyCredential)
		if !ok {
			return fmt.Errorf("run_tokens.key_credential: credential %q is not available", rt.KeyCredential)
		}
		tokens, err := NewRunTokens([]byte(key), rt.Issuer, rt.Lifetime.D(), o.Now)
		if err != nil {
			return fmt.Errorf("run_tokens.key_credential: %w", err)
		}
		s.runTokens = tokens
	}
	events, err := newLifecycle(o.Recorder, o.Meters, s.log)
	if err != nil {
		return err
	}
	m := newMinter(o.Now, events)
	for _, c := range cfg.Credentials {
		if !c.Minted() {
			continue
		}
		p, m2 := s.provider(c, o)
		m.providers[c.Name], m.timeouts[c.Name], m.refresh[c.Name] = p, m2.Timeout.D(), m2.RefreshBefore.D()
	}
	if len(m.providers) == 0 {
		return nil
	}
	if o.Meters != nil {
		if err := observeLeases(o.Meters, m); err != nil {
			return err
		}
	}
	s.dest = destinationsOf(cfg, m)
	s.minter = m
	return nil
}

func (s *Store) provider(c config.Credential, o MintOptions) (provider, config.Minting) {
	secret := func(name string) func() (string, bool) { return func() (string, bool) { return s.Get(name) } }
	switch {
	case c.OAuth2 != nil:
		return newOAuthProvider(c.Name, *c.OAuth2, nil, nil, secret(c.OAuth2.ClientSecretCredential), o.HTTP), c.OAuth2.Minting
	case c.TokenExchange != nil:
		te := c.TokenExchange
		return newOAuthProvider(c.Name, te.OAuth2ClientCredentials, te, s.runTokens, secret(te.ClientSecretCredential), o.HTTP), te.Minting
	default:
		g := c.GitHubApp
		return &githubProvider{name: c.Name, cfg: *g, key: secret(g.PrivateKeyCredential), http: o.HTTP, now: o.Now}, g.Minting
	}
}

func destinationsOf(cfg *config.Config, m *minter) destinations {
	d := destinations{upstreams: map[string]string{}, routes: map[string]string{}, hosts: map[string]string{}}
	minted := func(r *config.CredentialRef) bool { return r != nil && m.providers[r.Name] != nil }
	for _, u := range cfg.Gateway.Upstreams {
		if minted(u.Credential) {
			d.upstreams[u.Name] = u.Credential.Name
		}
	}
	for _, r := range cfg.Proxy.Routes {
		if minted(r.Credential) {
			d.routes[r.Name] = r.Credential.Name
		}
	}
	for _, h := range cfg.Proxy.Hosts {
		if minted(h.Credential) {
			d.hosts[net.JoinHostPort(strings.ToLower(h.Host), strconv.Itoa(h.Port))] = h.Credential.Name
		}
	}
	return d
}

// of is the minted credential configured for the destination in names ("" none).
func (d destinations) of(in *policy.Input) string {
	switch {
	case in.MCP != nil:
		return d.upstreams[in.MCP.Upstream]
	case in.HTTP == nil:
		return ""
	case in.HTTP.Route != "":
		return d.routes[in.HTTP.Route]
	}
	return d.hosts[net.JoinHostPort(in.HTTP.Host, strconv.Itoa(in.HTTP.Port))]
}

// Destination is the minted credential a call's destination injects ("" none: static
// credentials are not in the input).
func (s *Store) Destination(in *policy.Input) string {
	if s.minter == nil {
		return ""
	}
	return s.dest.of(in)
}

// ScopeOf is Scope for a named credential and a run (a call whose destination was not in its
// input).
func (s *Store) ScopeOf(name string, run Run) (*policy.Credential, string) {
	return s.minter.providers[name].scope(run)
}

// Minted reports whether name is a credential minted per run.
func (s *Store) Minted(name string) bool {
	return s.minter != nil && s.minter.providers[name] != nil
}

// Take is the run's token of credential name for scope (with its fingerprint fp): the current
// one, or one minted now by one of the run's callers while the others wait. An error is an
// *Unavailable whose reason is Sandgate's own text.
func (s *Store) Take(ctx context.Context, name string, run Run, scope *policy.Credential, fp string) (Lease, error) {
	if !s.Minted(name) {
		return Lease{}, &Unavailable{Credential: name, Provider: config.ProviderStatic, Reason: "not a minted credential"}
	}
	if run.Key == "" || run.Key == "anonymous" {
		return Lease{}, &Unavailable{Credential: name, Provider: s.minter.providers[name].kind(),
			Reason: "a credential minted per run needs a known sandbox"}
	}
	return s.minter.take(ctx, name, run, scope, fp)
}

// Forget ends the runs of key (a run's key, or a sandbox's "namespace/sandbox"): their tokens
// are revoked where the provider can and never handed out again; the next call of a run of
// that key mints anew. It returns how many tokens ended.
func (s *Store) Forget(key, reason string) int {
	if s.minter == nil {
		return 0
	}
	return s.minter.forget(key, reason)
}

// JWKS is the public key set of the run tokens; nil without run_tokens.
func (s *Store) JWKS() []byte {
	if s.runTokens == nil {
		return nil
	}
	return s.runTokens.JWKS()
}

// Generation changes whenever Values would return something else (a rotated static value, a
// token minted, replaced or expired), so that a response guard rebuilds its needles only then.
func (s *Store) Generation() uint64 {
	g := s.gen.Load()
	if s.minter != nil {
		g += s.minter.gen.Load()
	}
	return g
}

// mintedValues are the live minted tokens (nil without minted credentials).
func (s *Store) mintedValues() []string {
	if s.minter == nil {
		return nil
	}
	return s.minter.live.Load().all
}

// HasMinted reports whether any credential is minted per run.
func (s *Store) HasMinted() bool { return s.minter != nil }

// SandboxValues are the live minted tokens of the runs of sandbox k (a response to it can
// betray no other run's token: its upstream got none), without the static values.
func (s *Store) SandboxValues(k SandboxKey) []string {
	if s.minter == nil {
		return nil
	}
	return s.minter.live.Load().bySbx[k]
}

// IsUnavailable reports err as a minted credential that cannot be had, with its details.
func IsUnavailable(err error) (*Unavailable, bool) {
	var u *Unavailable
	ok := errors.As(err, &u)
	return u, ok
}

// observeLeases exports how many runs hold a token of each minted credential.
func observeLeases(mp metric.MeterProvider, m *minter) error {
	g, err := mp.Meter("github.com/sandgate/sandgate/internal/credential").Int64ObservableGauge("sandgate.credential.runs",
		metric.WithDescription("Sandbox runs holding a live minted token, by credential"))
	if err != nil {
		return fmt.Errorf("credential metrics: %w", err)
	}
	_, err = mp.Meter("github.com/sandgate/sandgate/internal/credential").RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for name, n := range m.leaseCount() {
			o.ObserveInt64(g, n, metric.WithAttributes(attribute.String("credential", name)))
		}
		return nil
	}, g)
	if err != nil {
		return fmt.Errorf("credential metrics: %w", err)
	}
	return nil
}
