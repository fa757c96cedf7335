// Package credential holds the secrets Sandgate injects on behalf of sandboxes: upstream MCP
// tokens, model-API keys, the admin token. Static values come from files (mounted Kubernetes
// Secrets) or environment variables named in the config; the config itself never holds a
// value. Minted credentials (OAuth 2.0 client credentials, RFC 8693 token exchange, GitHub App
// installation tokens) are minted for each sandbox run, serve that run only and end with it
// (minted.go, docs/credentials.md).
//
// A value is only ever handed to code that writes it into an outgoing request. It is never
// logged: Store's errors and log lines name the credential, not its value.
package credential

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/config"
)

// retainRetired is how many earlier values of each credential Values still lists after a
// rotation. A request sent with the old key may be answered after the file changed, and the
// provider accepts the old key until the operator revokes it (docs/install.md, "Rotate a
// credential"): an upstream that echoes it must be scrubbed as if it were current.
const retainRetired = 2

// Store is the set of named credentials. It is safe for concurrent use.
type Store struct {
	mu      sync.RWMutex
	values  map[string]string
	retired map[string][]string // earlier values by name, oldest first, at most retainRetired
	sources []config.Credential
	getenv  func(string) string
	log     *slog.Logger
	// gen counts changes of the static values (Generation).
	gen atomic.Uint64

	// The minted credentials (EnableMinting): nil minter without any.
	minter    *minter
	runTokens *RunTokens
	dest      destinations
}

// NewStore reads every credential once. A file that cannot be read, an empty value or an unset
// environment variable is an error naming the credential.
func NewStore(sources []config.Credential, getenv func(string) string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{values: map[string]string{}, retired: map[string][]string{}, sources: sources, getenv: getenv, log: log}
	for i, src := range sources {
		if src.Minted() {
			continue
		}
		v, err := s.read(src)
		if err != nil {
			return nil, fmt.Errorf("credentials[%d] (%s): %w", i, src.Name, err)
		}
		s.values[src.Name] = v
	}
	return s, nil
}

// FromValues builds a store from literal values, for tests and embedded use.
func FromValues(values map[string]string) *Store {
	s := &Store{values: map[string]string{}, retired: map[string][]string{}, log: slog.New(slog.DiscardHandler)}
	for k, v := range values {
		s.values[k] = v
	}
	return s
}

func (s *Store) read(src config.Credential) (string, error) {
	if src.Env != "" {
		v := s.getenv(src.Env)
		if v == "" {
			return "", fmt.Errorf("environment variable %s is unset or empty", src.Env)
		}
		return v, nil
	}
	b, err := os.ReadFile(src.File)
	if err != nil {
		return "", fmt.Errorf("read credential file: %w", err)
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) == 0 {
		return "", fmt.Errorf("credential file %s is empty", src.File)
	}
	return string(b), nil
}

// Get returns the value of the named credential.
func (s *Store) Get(name string) (string, bool) {
	s.mu.RLock()
	v, ok := s.values[name]
	s.mu.RUnlock()
	return v, ok
}

// Values returns every current value, the last retainRetired values of each rotated
// credential, and every live minted token of every run, once each, for code that must make
// sure none leaves towards a sandbox (response scrubbing, leak tests).
func (s *Store) Values() []string {
	return append(s.StaticValues(), s.mintedValues()...)
}

// StaticValues is Values without the minted tokens.
func (s *Store) StaticValues() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.values))
	for _, v := range s.values {
		out = append(out, v)
	}
	for _, vs := range s.retired {
		for _, v := range vs {
			if !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	return out
}

// Refresh re-reads the file-backed credentials. A file that fails to read keeps its last value
// (a Secret being rotated is briefly absent); the failure is logged by name.
func (s *Store) Refresh() (changed []string) {
	for _, src := range s.sources {
		if src.File == "" || src.Minted() {
			continue
		}
		v, err := s.read(src)
		if err != nil {
			s.log.Warn("credential refresh failed; keeping the last value", "credential", src.Name, "err", err)
			continue
		}
		s.mu.Lock()
		if old := s.values[src.Name]; old != v {
			s.retire(src.Name, old)
			s.values[src.Name] = v
			changed = append(changed, src.Name)
			s.gen.Add(1)
		}
		s.mu.Unlock()
	}
	for _, name := range changed {
		s.log.Info("credential reloaded", "credential", name)
	}
	return changed
}

// retire remembers old as an earlier value of name, forgetting the oldest beyond
// retainRetired. The caller holds s.mu.
func (s *Store) retire(name, old string) {
	r := append(s.retired[name], old)
	if len(r) > retainRetired {
		r = r[len(r)-retainRetired:]
	}
	s.retired[name] = r
}

// Watch refreshes the file-backed credentials every interval until ctx ends. Polling, rather
// than file events, copes with every way a Secret volume swaps its files.
func (s *Store) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	s.watch(ctx, t.C)
}

// watch refreshes on every tick until ctx ends (tests send the ticks).
func (s *Store) watch(ctx context.Context, ticks <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			s.Refresh()
		}
	}
}

// Inject writes the credential value v into h as ref says, replacing whatever h carried under
// that header (a sandbox's own value never travels on next to Sandgate's).
func Inject(h http.Header, ref *config.CredentialRef, v string) {
	h.Del(ref.Header)
	h.Set(ref.Header, ref.Render(v))
}
