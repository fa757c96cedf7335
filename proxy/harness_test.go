package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

const realKey = "sk-ant-REAL-0123456789abcdef"

// standIn is a local TLS server speaking enough of the Anthropic Messages API.
type standIn struct {
	addr    string
	port    int
	ca      *CA
	caPath  string
	mu      sync.Mutex
	keys    []string
	headers []http.Header
	bodies  [][32]byte // SHA-256 of each request body received
}

func (s *standIn) receivedBody(sum [32]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.bodies, sum)
}

func (s *standIn) seen() ([]string, []http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]http.Header(nil), s.headers...)
}

// newTestCA is a CA of this test's own, for an upstream stand-in's certificates, and its
// certificate's path.
func newTestCA(t testing.TB) (*CA, string) {
	certPath, keyPath, err := InitCA(t.TempDir(), false, time.Now())
	require.NoError(t, err)
	ca, err := LoadCA(certPath, keyPath)
	require.NoError(t, err)
	return ca, certPath
}

func startStandIn(t testing.TB) *standIn {
	ca, certPath := newTestCA(t)
	s := &standIn{ca: ca, caPath: certPath}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.addr = ln.Addr().String()
	s.port = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(s.serve), ErrorLog: log.New(io.Discard, "", 0), TLSConfig: &tls.Config{
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) },
		NextProtos:     []string{"h2", "http/1.1"},
	}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *standIn) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.keys = append(s.keys, r.Header.Get("X-Api-Key"))
	s.headers = append(s.headers, r.Header.Clone())
	s.bodies = append(s.bodies, sha256.Sum256(body))
	s.mu.Unlock()
	if f := standInPaths[r.URL.Path]; f != nil {
		f(w, r)
		return
	}
	if r.URL.Path != "/v1/messages" || r.Method != http.MethodPost {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[]}`)
		return
	}
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	// A careless upstream echoing the key: Sandgate must remove this header.
	w.Header().Set("X-Echo-Key", "key="+r.Header.Get("X-Api-Key"))
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"Hello from stand-in"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":34}}`, req.Model)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	events := []string{
		`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"` + req.Model + `","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`,
		`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello "}}`,
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"streamed"}}`,
		`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
		`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`,
		`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
	}
	for _, e := range events {
		_, _ = io.WriteString(w, e+"\n\n")
		f.Flush()
	}
}

// testResolver plays DNS: fixed answers, and rebind.test answering public, then private.
type testResolver struct {
	rebindCalls atomic.Int32
}

func (r *testResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	switch host {
	case "api.anthropic.com", "tunnel.test", "raw.test":
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	case "raw-public.test": // a public name for plain forwarding, dialed on loopback
		return []netip.Addr{netip.MustParseAddr(rebindPublic)}, nil
	case "internal.test":
		return []netip.Addr{netip.MustParseAddr("10.1.2.3")}, nil
	case "rebind.test":
		if r.rebindCalls.Add(1) == 1 {
			return []netip.Addr{netip.MustParseAddr(rebindPublic)}, nil
		}
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

const rebindPublic = "198.51.100.7" // TEST-NET-2; never dialed for real

// recorder tees events into memory for assertions and into the real audit file writer.
type recorder struct {
	w      *audit.Writer
	mu     sync.Mutex
	events []audit.Event
	broken atomic.Bool
}

func (r *recorder) Record(ev *audit.Event) error {
	if err := r.w.Record(ev); err != nil {
		return err
	}
	r.mu.Lock()
	r.events = append(r.events, *ev)
	r.mu.Unlock()
	return nil
}

func (r *recorder) Healthy() error {
	if r.broken.Load() {
		return fmt.Errorf("%w: test sink broken", audit.ErrUnhealthy)
	}
	return r.w.Healthy()
}

func (r *recorder) all() []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Event(nil), r.events...)
}

// waitFor returns the first event matching f, waiting up to 5s (tunnel events come at close).
func (r *recorder) waitFor(t testing.TB, f func(audit.Event) bool) audit.Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range r.all() {
			if f(e) {
				return e
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no audit event matched; have %d events", len(r.all()))
	return audit.Event{}
}

type harness struct {
	p        *Proxy
	addr     string // proxy listener
	caPath   string // Sandgate's CA, for curl --cacert
	up       *standIn
	rec      *recorder
	res      *testResolver
	auditDir string
	stop     func() error // ends Serve (once) and returns its error
	dialsMu  sync.Mutex
	dials    []string // every address the proxy dialed
}

func (h *harness) dialed() []string {
	h.dialsMu.Lock()
	defer h.dialsMu.Unlock()
	return append([]string(nil), h.dials...)
}

type harnessOption func(*config.Proxy)

func newHarness(t testing.TB, opts ...harnessOption) *harness {
	t.Helper()
	return newHarnessWith(t, nil, opts...)
}

// newHarnessWith is newHarness with a change to the proxy's Options (nil for none).
func newHarnessWith(t testing.TB, with func(*Options), opts ...harnessOption) *harness {
	t.Helper()
	h := &harness{up: startStandIn(t), res: &testResolver{}}
	caDir := t.TempDir()
	h.caPath, _, _ = func() (string, string, error) {
		c, k, err := InitCA(caDir, false, time.Now())
		require.NoError(t, err)
		return c, k, nil
	}()
	cred := &config.CredentialRef{Name: "anthropic", Header: "x-api-key", Format: "{value}"}
	cfg, err := config.Parse([]byte(`
credentials: [{name: anthropic, env: X}]
proxy:
  ca: {cert: `+filepath.Join(caDir, CACertFile)+`, key: `+filepath.Join(caDir, CAKeyFile)+`}
  routes:
    - {name: anthropic, upstream: "https://api.anthropic.com", api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
  hosts:
    - {host: api.anthropic.com, mode: intercept, api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
    - {host: tunnel.test, mode: tunnel, allow_private: true}
    - {host: 169.254.169.254, mode: tunnel}
    - {host: 10.0.0.1, mode: tunnel}
    - {host: "::1", mode: tunnel}
    - {host: internal.test, mode: tunnel}
    - {host: rebind.test, mode: tunnel}
  denied_cidrs: ["10.96.0.0/12"]
  allowed_cidrs: ["198.51.100.7/32"]   # rebindPublic, a documentation address standing in for a public one
  limits: {max_header_bytes: 16384, tunnels_per_sandbox: 4, client_handshake_timeout: 500ms, tunnel_idle_timeout: 2s}
`), t.TempDir())
	require.NoError(t, err)
	_ = cred
	for _, o := range opts {
		o(&cfg.Proxy)
	}
	ids, err := identity.NewStatic([]identity.StaticEntry{
		{Addresses: []string{"127.0.0.2"}, Namespace: "agents", Sandbox: "alpha-1", Template: "alpha"},
		{Addresses: []string{"127.0.0.3"}, Namespace: "agents", Sandbox: "beta-1", Template: "beta"},
		{Addresses: []string{"127.0.0.1"}, Namespace: "agents", Sandbox: "sdk-1", Template: "beta"},
	})
	require.NoError(t, err)
	eng, err := policy.New(context.Background(), "testdata/policies")
	require.NoError(t, err)
	h.auditDir = t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: h.auditDir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	h.rec = &recorder{w: audit.NewWriter(sink)}
	roots := x509.NewCertPool()
	roots.AddCert(h.up.ca.cert)
	po := Options{
		Config: cfg.Proxy, Identity: ids, Policy: eng, Audit: h.rec,
		Credentials: credential.FromValues(map[string]string{"anthropic": realKey}),
		Resolver:    h.res, UpstreamRoots: roots,
		Dial: h.loopbackOnlyDial(t),
	}
	if with != nil {
		with(&po)
	}
	for _, v := range po.Credentials.Values() {
		sandboxReads.Secret(v)
	}
	h.p, err = New(po)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.p.Serve(ctx, ln) }()
	var once sync.Once
	var serveErr error
	h.stop = func() error {
		once.Do(func() { cancel(); serveErr = <-done })
		return serveErr
	}
	t.Cleanup(func() {
		_ = h.stop()
		require.NoError(t, h.rec.w.Close(context.Background()))
		rep, err := audit.Verify(h.auditDir)
		require.NoError(t, err)
		require.True(t, rep.OK(), "audit chain: %s", rep)
	})
	return h
}

// loopbackOnlyDial is the proxy's dialer in tests: every dial must target loopback, except the
// rebinding test's public address, which is recorded and served by the stand-in instead (no
// packet leaves the machine). Port 443 is the stand-in's port.
func (h *harness) loopbackOnlyDial(t testing.TB) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.dialsMu.Lock()
		h.dials = append(h.dials, addr)
		h.dialsMu.Unlock()
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			t.Errorf("proxy dialed %q, which is not a checked ip:port", addr)
			return nil, err
		}
		if !ap.Addr().IsLoopback() && ap.Addr().String() != rebindPublic {
			t.Errorf("proxy dialed non-loopback address %s", addr)
			return nil, fmt.Errorf("test: refusing to dial %s", addr)
		}
		port := int(ap.Port())
		if port == 443 {
			port = h.up.port
		}
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
}

// rawClient opens a TCP connection to the proxy from a given sandbox address.
func (h *harness) rawClient(t testing.TB, from string) (net.Conn, *bufio.Reader) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", h.addr)
	require.NoError(t, err)
	c = sandboxReads.Conn(t.Name(), c)
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func (h *harness) sandgateRoots(t testing.TB) *x509.CertPool {
	b, err := os.ReadFile(h.caPath)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(b))
	return pool
}
