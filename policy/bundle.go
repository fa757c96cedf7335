package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/download"
	"github.com/open-policy-agent/opa/v1/keys"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/rest"
)

// BundleConfig names a signed OPA bundle and the key that verifies it: exactly one of File,
// URL and OCI.
type BundleConfig struct {
	// File is a bundle (.tar.gz) on disk; Poll reads it again and installs it when its bytes
	// changed.
	File string
	// URL is a bundle served over HTTP(S) by an OPA bundle service; Poll asks with the ETag
	// of the last bundle (If-None-Match), so an unchanged bundle costs a 304.
	URL string
	// OCI is a registry reference (registry/repository:tag), pulled by OPA's OCI downloader:
	// an image manifest whose layer of type application/vnd.oci.image.layer.v1.tar+gzip is
	// the bundle, as `oras push` or OPA's tooling write it.
	OCI string
	// OCIPlainHTTP talks to the registry over plain HTTP (a registry on loopback).
	OCIPlainHTTP bool
	// OCIStore is the folder OPA's OCI downloader keeps blobs in ("": a temporary folder).
	OCIStore string
	// PublicKey is the PEM public key (or HMAC secret) that verifies .signatures.json.
	PublicKey string
	// KeyID is the key's id in the signatures ("default" is opa build's).
	KeyID string
	// Algorithm is the signing algorithm (default RS256).
	Algorithm string
	// Scope, if set, must equal the signature's scope.
	Scope string
	// PollInterval is how often Run looks at the bundle again (default 60s).
	PollInterval time.Duration
}

// source names the bundle in logs and errors.
func (c BundleConfig) source() string {
	switch {
	case c.File != "":
		return "bundle file " + c.File
	case c.URL != "":
		return "bundle " + c.URL
	default:
		return "bundle oci://" + c.OCI
	}
}

// BundleSource keeps an engine's revision in step with a signed OPA bundle, read with OPA's own
// bundle reader and downloaders. Every bundle must be signed by the configured key: an unsigned
// or wrongly signed one is refused like a policy that does not compile (the last good revision
// keeps serving, Status reports the engine degraded, the refusal is counted with reason
// "signature"). The revision of every decision is the bundle manifest's revision.
type BundleSource struct {
	engine   *Engine
	cfg      BundleConfig
	bvc      *bundle.VerificationConfig
	fileHash string // sha256 of the file bundle last installed
	trigger  func(context.Context) error
	stop     func()
}

// NewBundleEngine builds an engine that serves the bundle cfg names and loads it once. A file
// bundle that cannot be loaded is an error; a remote one that cannot be fetched yet leaves the
// engine denying everything ("no policy is loaded") and degraded until a poll succeeds.
func NewBundleEngine(ctx context.Context, cfg BundleConfig, opts ...Option) (*Engine, *BundleSource, error) {
	if n := btoi(cfg.File != "") + btoi(cfg.URL != "") + btoi(cfg.OCI != ""); n != 1 {
		return nil, nil, errors.New("bundle: set exactly one of file, url and oci")
	}
	if cfg.PublicKey == "" {
		return nil, nil, errors.New("bundle: a public key is required (bundles must be signed)")
	}
	if cfg.KeyID == "" {
		cfg.KeyID = "default"
	}
	if cfg.Algorithm == "" {
		cfg.Algorithm = "RS256"
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 60 * time.Second
	}
	e := newEngine(cfg.source(), opts)
	src := &BundleSource{engine: e, cfg: cfg, stop: func() {}, bvc: bundle.NewVerificationConfig(
		map[string]*bundle.KeyConfig{cfg.KeyID: {Key: cfg.PublicKey, Algorithm: cfg.Algorithm, Scope: cfg.Scope}},
		cfg.KeyID, cfg.Scope, nil)}
	if err := src.setupDownloader(); err != nil {
		return nil, nil, err
	}
	e.bundle = src
	err := src.Poll(ctx)
	if err != nil && cfg.File != "" {
		src.stop()
		return nil, nil, err
	}
	return e, src, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

var parserOpts = ast.ParserOptions{RegoVersion: ast.RegoV1}

// setupDownloader builds OPA's downloader for a remote bundle, triggered by Poll only.
func (s *BundleSource) setupDownloader() error {
	if s.cfg.File != "" {
		s.trigger = s.pollFile
		return nil
	}
	manual := plugins.TriggerManual
	dcfg := download.Config{Trigger: &manual}
	if err := dcfg.ValidateAndInjectDefaults(); err != nil {
		return fmt.Errorf("bundle download config: %w", err)
	}
	base, path, err := s.endpoint()
	if err != nil {
		return err
	}
	// OPA's downloader would log through its own logger, in its own format; every attempt is
	// logged by settle instead.
	client, err := rest.New(fmt.Appendf(nil, `{"url": %q}`, base), map[string]*keys.Config{},
		rest.Logger(logging.NewNoOpLogger()))
	if err != nil {
		return fmt.Errorf("bundle client: %w", err)
	}
	if s.cfg.URL != "" {
		d := download.New(dcfg, client, path).WithCallback(s.update).
			WithBundleVerificationConfig(s.bvc).WithBundleParserOpts(parserOpts)
		s.trigger = d.Trigger
		return nil
	}
	d := download.NewOCI(dcfg, client, path, s.cfg.OCIStore).WithCallback(s.update).
		WithBundleVerificationConfig(s.bvc).WithBundleParserOpts(parserOpts)
	s.trigger = d.Trigger
	s.stop = func() { d.Stop(context.Background()) } // removes a temporary store
	return nil
}

// endpoint splits the source into the service's base URL and the path OPA's downloader asks
// for (for OCI: the registry's URL and the full reference).
func (s *BundleSource) endpoint() (base, path string, err error) {
	if s.cfg.OCI != "" {
		host, _, _ := strings.Cut(s.cfg.OCI, "/")
		scheme := "https"
		if s.cfg.OCIPlainHTTP {
			scheme = "http"
		}
		return scheme + "://" + host, s.cfg.OCI, nil
	}
	u, err := url.Parse(s.cfg.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", "", fmt.Errorf("bundle url %q is not an http(s) URL", s.cfg.URL)
	}
	path = strings.TrimPrefix(u.EscapedPath(), "/")
	if u.RawQuery != "" {
		path += "?" + u.RawQuery
	}
	return u.Scheme + "://" + u.Host, path, nil
}

// Poll looks at the bundle once: a new, verified revision is installed; an unchanged one
// (same bytes, ETag or digest) is nothing; a refused one leaves the last good revision serving.
func (s *BundleSource) Poll(ctx context.Context) error {
	return s.trigger(ctx)
}

// Run polls every PollInterval until ctx ends.
func (s *BundleSource) Run(ctx context.Context) error {
	defer s.stop()
	tick, stop := s.engine.clock.NewTicker(s.cfg.PollInterval)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			_ = s.Poll(ctx) // logged, counted and kept in Status by install
		}
	}
}

func (s *BundleSource) pollFile(ctx context.Context) error {
	raw, err := os.ReadFile(s.cfg.File)
	if err != nil {
		return s.install(ctx, nil, "", fmt.Errorf("read %s: %w", s.cfg.File, err))
	}
	sum := sha256.Sum256(raw)
	hash := hex.EncodeToString(sum[:])
	if hash == s.fileHash && s.engine.Status().ReloadErr == nil {
		return nil
	}
	b, err := bundle.NewReader(bytes.NewReader(raw)).WithBundleVerificationConfig(s.bvc).
		WithRegoVersion(ast.RegoV1).Read()
	if err != nil {
		return s.install(ctx, nil, "", fmt.Errorf("%s: %w", s.cfg.File, err))
	}
	if err := s.install(ctx, &b, hash, nil); err != nil {
		return err
	}
	s.fileHash = hash
	return nil
}

// update is OPA's downloader callback: an error, a new bundle, or nil for "not modified".
func (s *BundleSource) update(ctx context.Context, u download.Update) error {
	if u.Error != nil {
		return s.install(ctx, nil, "", fmt.Errorf("%s: %w", s.cfg.source(), u.Error))
	}
	if u.Bundle == nil {
		return s.install(ctx, nil, "", nil)
	}
	return s.install(ctx, u.Bundle, u.ETag, nil)
}

// install compiles b (nil: nothing new) and settles the attempt on the engine; fetchErr is why
// no bundle could be read. etag identifies the bundle's bytes when its manifest has no revision.
func (s *BundleSource) install(_ context.Context, b *bundle.Bundle, etag string, fetchErr error) error {
	e := s.engine
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	prev := e.cur.Load()
	var rev *revision
	err, reason := fetchErr, ""
	if err != nil {
		reason = bundleErrorReason(err)
	} else if b != nil {
		id := b.Manifest.Revision
		if id == "" {
			id = "etag:" + etag
		}
		if prev != nil && prev.id == id {
			return e.settle(prev, nil, nil, "", "") // the revision serving already
		}
		modules := make(map[string]*ast.Module, len(b.Modules))
		for _, m := range b.Modules {
			modules[m.Path] = m.Parsed
		}
		data := b.Data
		if data == nil {
			data = map[string]any{}
		}
		if rev, err = compileModules(s.cfg.source(), id, modules, data, e.cacheMax); err != nil {
			reason = ReloadCompileError
		}
	}
	return e.settle(prev, rev, err, reason, "")
}

// bundleErrorReason classifies a refused bundle: a signature problem, or any other failure to
// fetch or read it. OPA's reader reports signature problems only as text.
func bundleErrorReason(err error) string {
	msg := strings.ToLower(err.Error())
	for _, s := range []string{"signature", "verif", "jwt", "token", "digest"} {
		if strings.Contains(msg, s) {
			return ReloadSignature
		}
	}
	return ReloadBundleError
}
