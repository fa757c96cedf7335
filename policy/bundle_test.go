package policy_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/policy"
)

type signingKey struct{ private, public string }

func newSigningKey(t *testing.T) signingKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalECPrivateKey(k)
	require.NoError(t, err)
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	require.NoError(t, err)
	return signingKey{
		private: string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})),
		public:  string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
	}
}

// allowTool is a policy that allows exactly one tool.
func allowTool(tool string) string {
	return `package sandgate

default decision := {"allow": false, "reason": "not ` + tool + `", "code": "not_allowed"}

decision := {"allow": true, "reason": "` + tool + ` is fine"} if input.mcp.tool == allowed
` + "\nallowed := \"" + tool + "\"\n"
}

// buildBundle writes a bundle of revision rev serving src, signed by key (nil: unsigned) as
// `opa build --signing-key` does.
func buildBundle(t *testing.T, rev, src string, key *signingKey) []byte {
	t.Helper()
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: rev, Roots: &[]string{""}},
		Data:     map[string]any{},
		Modules: []bundle.ModuleFile{{Path: "/sandgate.rego", URL: "/sandgate.rego", Raw: []byte(src),
			Parsed: ast.MustParseModuleWithOpts(src, ast.ParserOptions{RegoVersion: ast.RegoV1})}},
	}
	b.Manifest.Init()
	if key != nil {
		require.NoError(t, b.GenerateSignature(bundle.NewSigningConfig(key.private, "ES256", ""), "default", false))
	}
	var buf bytes.Buffer
	require.NoError(t, bundle.NewWriter(&buf).Write(b))
	return buf.Bytes()
}

// bundleServer is an OPA bundle service on loopback: one bundle, its ETag the hash of its
// bytes, 304 for a matching If-None-Match.
type bundleServer struct {
	mu          sync.Mutex
	body        []byte
	notModified int
	srv         *httptest.Server
}

func newBundleServer(t *testing.T) *bundleServer {
	s := &bundleServer{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/bundles/sandgate.tar.gz" {
			http.NotFound(w, r)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		sum := sha256.Sum256(s.body)
		etag := `"` + hex.EncodeToString(sum[:8]) + `"`
		if r.Header.Get("If-None-Match") == etag {
			s.notModified++
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write(s.body)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *bundleServer) serve(body []byte) {
	s.mu.Lock()
	s.body = body
	s.mu.Unlock()
}

func (s *bundleServer) url() string { return s.srv.URL + "/bundles/sandgate.tar.gz" }

func callTool(tool string) *policy.Input {
	return &policy.Input{Kind: audit.KindToolsCall, MCP: &policy.MCP{Upstream: "gh", Tool: tool}}
}

// reloads records every reload result the engine reports.
type reloads struct {
	mu  sync.Mutex
	all []policy.ReloadResult
}

func (r *reloads) observe(res policy.ReloadResult) {
	r.mu.Lock()
	r.all = append(r.all, res)
	r.mu.Unlock()
}

func (r *reloads) last() policy.ReloadResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.all[len(r.all)-1]
}

func TestBundleOverHTTPIsLoadedAndETagPollingFollowsNewRevisions(t *testing.T) {
	ctx := t.Context()
	key := newSigningKey(t)
	srv := newBundleServer(t)
	srv.serve(buildBundle(t, "v1", allowTool("echo"), &key))

	e, src, err := policy.NewBundleEngine(ctx, policy.BundleConfig{URL: srv.url(), PublicKey: key.public, Algorithm: "ES256"})
	require.NoError(t, err)
	assert.Equal(t, "v1", e.Revision(), "the revision is the bundle manifest's")
	d := e.Decide(ctx, callTool("echo"))
	assert.True(t, d.Allow)
	assert.Equal(t, "v1", d.Revision)

	require.NoError(t, src.Poll(ctx))
	assert.Equal(t, 1, srv.notModified, "an unchanged bundle is asked for with its ETag and not sent again")
	assert.Equal(t, "v1", e.Revision())

	srv.serve(buildBundle(t, "v2", allowTool("search"), &key))
	require.NoError(t, src.Poll(ctx))
	assert.Equal(t, "v2", e.Revision())
	assert.False(t, e.Decide(ctx, callTool("echo")).Allow)
	d = e.Decide(ctx, callTool("search"))
	assert.True(t, d.Allow)
	assert.Equal(t, "v2", d.Revision)
	assert.False(t, e.Status().Degraded())
}

func TestBundleUnsignedOrWronglySignedIsRefusedAndTheLastGoodKept(t *testing.T) {
	key, other := newSigningKey(t), newSigningKey(t)
	tampered := func(t *testing.T) []byte {
		// Signed for one policy, shipped with another: the file hashes in the signature no
		// longer match.
		good := buildBundle(t, "v2", allowTool("delete_repo"), &key)
		b, err := bundle.NewReader(bytes.NewReader(good)).WithSkipBundleVerification(true).Read()
		require.NoError(t, err)
		evil := allowTool("everything")
		b.Modules[0].Raw = []byte(evil)
		b.Modules[0].Parsed = ast.MustParseModuleWithOpts(evil, ast.ParserOptions{RegoVersion: ast.RegoV1})
		var buf bytes.Buffer
		require.NoError(t, bundle.NewWriter(&buf).Write(b))
		return buf.Bytes()
	}
	cases := map[string]func(t *testing.T) []byte{
		"unsigned":              func(t *testing.T) []byte { return buildBundle(t, "v2", allowTool("delete_repo"), nil) },
		"signed by another key": func(t *testing.T) []byte { return buildBundle(t, "v2", allowTool("delete_repo"), &other) },
		"changed after signing": tampered,
		"not a bundle at all":   func(*testing.T) []byte { return []byte("<html>maintenance</html>") },
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			srv := newBundleServer(t)
			srv.serve(buildBundle(t, "v1", allowTool("echo"), &key))
			var seen reloads
			e, src, err := policy.NewBundleEngine(ctx, policy.BundleConfig{URL: srv.url(), PublicKey: key.public, Algorithm: "ES256"},
				policy.WithReloadObserver(seen.observe))
			require.NoError(t, err)
			require.Equal(t, "v1", e.Revision())

			srv.serve(bad(t))
			require.Error(t, src.Poll(ctx))
			assert.Equal(t, "v1", e.Revision(), "the last good revision keeps serving")
			assert.True(t, e.Decide(ctx, callTool("echo")).Allow)
			assert.False(t, e.Decide(ctx, callTool("delete_repo")).Allow)
			assert.True(t, e.Status().Degraded())
			res := seen.last()
			assert.False(t, res.Changed)
			if name != "not a bundle at all" {
				assert.Equal(t, policy.ReloadSignature, res.Reason, "%v", res.Err)
			}

			srv.serve(buildBundle(t, "v3", allowTool("search"), &key))
			require.NoError(t, src.Poll(ctx))
			assert.Equal(t, "v3", e.Revision())
			assert.False(t, e.Status().Degraded())
		})
	}
}

func TestBundleFileIsVerifiedAndReadAgainOnPoll(t *testing.T) {
	ctx := t.Context()
	key := newSigningKey(t)
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	cfg := policy.BundleConfig{File: path, PublicKey: key.public, Algorithm: "ES256"}

	require.NoError(t, os.WriteFile(path, buildBundle(t, "v1", allowTool("echo"), nil), 0o644))
	_, _, err := policy.NewBundleEngine(ctx, cfg)
	require.Error(t, err, "an unsigned file bundle is refused at start")
	assert.Contains(t, err.Error(), ".signatures.json")

	require.NoError(t, os.WriteFile(path, buildBundle(t, "v1", allowTool("echo"), &key), 0o644))
	e, src, err := policy.NewBundleEngine(ctx, cfg)
	require.NoError(t, err)
	assert.Equal(t, "v1", e.Revision())

	stranger := newSigningKey(t)
	require.NoError(t, os.WriteFile(path, buildBundle(t, "v2", allowTool("search"), &stranger), 0o644))
	require.Error(t, e.Reload(ctx), "Reload of a bundle engine looks at the bundle again")
	assert.Equal(t, "v1", e.Revision())
	assert.True(t, e.Status().Degraded())

	require.NoError(t, os.WriteFile(path, buildBundle(t, "v2", allowTool("search"), &key), 0o644))
	require.NoError(t, src.Poll(ctx))
	assert.Equal(t, "v2", e.Revision())
	assert.False(t, e.Status().Degraded())
}

func TestBundleDataIsServedWithItsPolicies(t *testing.T) {
	key := newSigningKey(t)
	src := `package sandgate

default decision := {"allow": false, "reason": "no"}

decision := {"allow": true, "reason": "listed"} if input.mcp.tool in data.tools.allowed
`
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: "with-data", Roots: &[]string{""}},
		Data:     map[string]any{"tools": map[string]any{"allowed": []any{"echo", "add"}}},
		Modules: []bundle.ModuleFile{{Path: "/sandgate.rego", URL: "/sandgate.rego", Raw: []byte(src),
			Parsed: ast.MustParseModuleWithOpts(src, ast.ParserOptions{RegoVersion: ast.RegoV1})}},
	}
	b.Manifest.Init()
	require.NoError(t, b.GenerateSignature(bundle.NewSigningConfig(key.private, "ES256", ""), "default", false))
	var buf bytes.Buffer
	require.NoError(t, bundle.NewWriter(&buf).Write(b))
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))

	e, _, err := policy.NewBundleEngine(t.Context(), policy.BundleConfig{File: path, PublicKey: key.public, Algorithm: "ES256"})
	require.NoError(t, err)
	assert.True(t, e.Decide(t.Context(), callTool("add")).Allow, "data.json of the bundle is under data")
	assert.False(t, e.Decide(t.Context(), callTool("delete_repo")).Allow)
}
