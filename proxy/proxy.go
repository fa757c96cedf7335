package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/admission"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/httpconn"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/proxy/hostport"
)

// Options configure a Proxy. Config, Identity, Policy, Audit and Credentials are required.
type Options struct {
	Config   config.Proxy
	Identity identity.Resolver
	// Core is the request path shared with the gateway. nil builds one from Policy, Audit,
	// Admission, Meters, Tracer and Log (tests and embedded use).
	Core        *call.Core
	Policy      call.Decider
	Audit       audit.Recorder
	Credentials *credential.Store
	Meters      metric.MeterProvider // nil: no metrics
	Log         *slog.Logger         // nil: discard

	// Resolver resolves upstream names for the dial guard (default net.DefaultResolver).
	Resolver Resolver
	// Dial connects to an address the dial guard has checked, given as "ip:port" (default a
	// net.Dialer). Tests use it to keep every packet on loopback.
	Dial DialFunc
	// UpstreamRoots verifies upstream TLS certificates (default the system roots).
	UpstreamRoots *x509.CertPool
	// CA signs the certificates of intercepted hosts; default LoadCA(Config.CA.Cert, Config.CA.Key)
	// when those are set.
	CA *CA
	// Admission counts every request and tunnel against the caller's budgets, adds its usage and
	// grants to the policy input, and is charged the model tokens of each response; nil counts
	// nothing and adds no grants.
	Admission *admission.Admission
	// Tracer starts a span per request and tunnel; its W3C traceparent replaces the sandbox's
	// on every forwarded request. nil makes no spans (a sandbox's traceparent then passes as is).
	Tracer trace.TracerProvider
	// Drain bounds how long Serve lets the requests in flight finish once ctx ended (default
	// 10s; shutdown.drain); then they are cut, each with its event, and every tunnel closed.
	Drain time.Duration
}

// Proxy is the egress policy proxy. Serve it on the proxy listener; it is an http.Handler as
// well, but only Serve inspects request framing (smuggling, oversized heads).
//
// Security behaviour, exactly:
//
//   - Identity is the TCP peer address alone; X-Forwarded-For and friends are never read.
//   - Requests from a caller the policy does not allow are refused (403) before anything is
//     dialed; while the audit log is unhealthy every new request and tunnel is refused (503,
//     "audit log unavailable").
//   - Outgoing requests lose the sandbox's Authorization, X-Api-Key, Proxy-Authorization and
//     the configured credential header, every hop-by-hop header (Connection and the headers it
//     names, Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade except for upgrades,
//     Proxy-Connection), Forwarded, X-Forwarded-*, X-Real-Ip, True-Client-Ip and Via. Then the
//     route's or host's credential is set in its configured header and format. Sandgate adds
//     no forwarding headers of its own.
//   - No credential value reaches a sandbox (scrub.go, internal/respguard): a response header,
//     trailer or header of a forwarded 1xx response that contains one (raw, hex, base64, behind
//     JSON or percent escapes) is removed, and the body is scanned as it streams and each
//     occurrence overwritten with a marker of the same length (in an event stream also a value
//     handed over in pieces); the event says credential_echoed. Hop-by-hop headers are
//     removed. Redirects are passed to the sandbox, never followed. Accept-Encoding is dropped
//     on every request that carries an injected credential, and its response is decoded (gzip,
//     deflate, br, zstd, any stack) or refused (502, upstream_encoding); a decompression bomb is
//     cut (upstream_too_large). Such a request loses Range and If-Range, and a partial
//     response to it is refused (502, upstream_partial).
//   - A response the upstream cut short (a body read error; an SSE stream that ends inside an
//     event or, for a model API, before its final event) is aborted towards the sandbox (no
//     chunked terminator; SSE goes chunked for this) and audited as upstream_truncated, 502.
//   - Model-API requests (api anthropic or openai) with a body are read up to
//     limits.body_bytes to give policy model, max_tokens and stream; a larger body is refused
//     (413), a body that is not one JSON object with unambiguous model/max_tokens/stream is
//     refused (400). Accept-Encoding is dropped so token usage can be read from the response.
//   - Route paths containing dot segments are refused (400).
//   - A request or CONNECT over the caller's rate limit or spent token budget is refused (429),
//     and so is every request while the limits store cannot be reached in fail_closed mode
//     (503), before policy is asked. Model tokens a response reports are charged to the budget;
//     a streamed (SSE) response that spends the budget ends after the event that did, and the
//     audit event's outcome error says token_budget_spent.
//   - Inside an intercepted tunnel every request is decided again; its Host must equal the
//     CONNECT target (421 otherwise) and an absolute URI is refused (400).
//   - A request head with both Content-Length and Transfer-Encoding, obsolete line folding, or
//     larger than limits.max_header_bytes is refused (400/431) and the connection closed.
//   - Every destination goes through the DialGuard: resolved once, every address classified
//     against the IANA special-purpose registries (embedded IPv4 decided as IPv4), refused
//     unless allowed, the checked address dialed.
type Proxy struct {
	opts   Options
	core   *call.Core
	cfg    config.Proxy
	log    *slog.Logger
	guard  *DialGuard
	ca     *CA
	routes map[string]*upstream
	hosts  map[string]*hostEntry // by normalised host:port
	plain  *upstream             // plain-HTTP forward requests
	rp     *httputil.ReverseProxy
	gp     *goproxy.ProxyHttpServer
	m      *metrics
	tracer trace.Tracer
	scrub  *respguard.Source

	mu      sync.Mutex
	tunnels map[string]int
	conns   map[net.Conn]struct{}
	closed  bool

	tunnelsDrain *tunnelDrain // requests in flight inside tunnels (drain.go)
}

type hostEntry struct {
	cfg config.ProxyHost
	up  *upstream // intercept only
}

// New builds a Proxy. It loads the CA when a host is intercepted and fails if that cannot be
// done, so a misconfiguration is found at start, not at the first CONNECT.
func New(o Options) (*Proxy, error) {
	if o.Identity == nil || o.Credentials == nil || (o.Core == nil && (o.Policy == nil || o.Audit == nil)) {
		return nil, errors.New("proxy: Identity, Credentials and Core (or Policy and Audit) are required")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Meters == nil {
		o.Meters = noop.NewMeterProvider()
	}
	if o.Tracer == nil {
		o.Tracer = tracenoop.NewTracerProvider()
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	cfg := o.Config
	if len(cfg.ResolveOverrides) > 0 {
		r, err := newOverrideResolver(cfg.ResolveOverrides, o.Resolver)
		if err != nil {
			return nil, err
		}
		o.Resolver = r
	}
	if o.Dial == nil {
		d := &net.Dialer{Timeout: cfg.Limits.DialTimeout.D(), KeepAlive: 30 * time.Second}
		o.Dial = d.DialContext
	}
	m, err := newMetrics(o.Meters)
	if err != nil {
		return nil, err
	}
	if o.Core == nil {
		if o.Core, err = call.New(call.Options{Policy: o.Policy, Audit: o.Audit, Admission: o.Admission,
			Credentials: o.Credentials, Meters: o.Meters, Tracer: o.Tracer, Log: o.Log}); err != nil {
			return nil, err
		}
	}
	p := &Proxy{opts: o, core: o.Core, cfg: cfg, log: o.Log, m: m, tracer: o.Tracer.Tracer("github.com/sandgate/sandgate/proxy"), routes: map[string]*upstream{}, hosts: map[string]*hostEntry{},
		tunnels: map[string]int{}, conns: map[net.Conn]struct{}{}, scrub: newScrubber(o.Credentials, cfg), tunnelsDrain: newTunnelDrain()}
	if p.guard, err = newDialGuard(o, cfg, m); err != nil {
		return nil, err
	}
	if err := p.addRoutes(cfg.Routes); err != nil {
		return nil, err
	}
	if o.CA, err = p.addHosts(cfg, o.CA); err != nil {
		return nil, err
	}
	p.ca = o.CA
	p.plain = p.newUpstream("http", hostport.Addr{}, "", "", config.APINone, nil, false)
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      exchangeTransport{},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamError,
		ErrorLog:       log.New(io.Discard, "", 0),
		BufferPool:     &copyBuffers,
	}
	p.gp = goproxy.NewProxyHttpServer()
	p.gp.Logger = log.New(io.Discard, "", 0)
	p.gp.OnRequest().HandleConnectFunc(p.handleConnect)
	return p, nil
}

// newDialGuard is the guard of every upstream dial, with the configured denied and allowed
// CIDRs.
func newDialGuard(o Options, cfg config.Proxy, m *metrics) (*DialGuard, error) {
	g := &DialGuard{resolver: o.Resolver, dial: o.Dial, timeout: cfg.Limits.DialTimeout.D(), onDeny: m.dialDenied,
		connectTo: map[hostport.Addr]netip.AddrPort{}}
	for dest, addr := range cfg.ConnectTo {
		d, err := hostport.Parse(dest, 0)
		if err != nil {
			return nil, fmt.Errorf("proxy.connect_to %s: %w", dest, err)
		}
		to, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("proxy.connect_to %s: %w", dest, err)
		}
		g.connectTo[d] = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	}
	for _, s := range cfg.DeniedCIDRs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("proxy.denied_cidrs: %w", err)
		}
		g.denied = append(g.denied, pfx.Masked())
	}
	for _, s := range cfg.AllowedCIDRs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("proxy.allowed_cidrs: %w", err)
		}
		g.allowed = append(g.allowed, pfx.Masked())
	}
	return g, nil
}

// addRoutes builds the upstream of every base-URL route.
func (p *Proxy) addRoutes(routes []config.ProxyRoute) error {
	for _, r := range routes {
		u, err := url.Parse(r.Upstream)
		if err != nil {
			return fmt.Errorf("proxy.routes %s: upstream: %w", r.Name, err)
		}
		base, err := hostport.Parse(u.Host, defaultPort(u.Scheme))
		if err != nil {
			return fmt.Errorf("proxy.routes %s: upstream: %w", r.Name, err)
		}
		p.routes[r.Name] = p.newUpstream(u.Scheme, base, strings.TrimSuffix(u.EscapedPath(), "/"), r.Name, r.API, r.Credential, r.AllowPrivate)
	}
	return nil
}

// addHosts registers the forward proxy's hosts; an intercepted one gets its upstream and needs
// the CA, loaded from proxy.ca when ca is nil. It returns the CA.
func (p *Proxy) addHosts(cfg config.Proxy, ca *CA) (*CA, error) {
	for _, h := range cfg.Hosts {
		a, err := hostport.Parse(net.JoinHostPort(h.Host, strconv.Itoa(h.Port)), 443)
		if err != nil {
			return nil, fmt.Errorf("proxy.hosts %s: %w", h.Host, err)
		}
		e := &hostEntry{cfg: h}
		if h.Mode == config.ModeIntercept {
			e.up = p.newUpstream("https", a, "", "", h.API, h.Credential, h.AllowPrivate)
			if ca == nil {
				if cfg.CA.Cert == "" {
					return nil, fmt.Errorf("proxy.hosts %s: intercept needs proxy.ca", h.Host)
				}
				if ca, err = LoadCA(cfg.CA.Cert, cfg.CA.Key); err != nil {
					return nil, err
				}
			}
		}
		p.hosts[a.String()] = e
	}
	return ca, nil
}

func defaultPort(scheme string) int {
	if scheme == "http" {
		return 80
	}
	return 443
}

// Serve accepts sandbox connections on ln until ctx ends, then stops accepting, waits up to
// Options.Drain for the requests in flight (inside tunnels too), cuts what is left, each cut
// request with its event, and closes every tunnel (internal/httpconn serves each connection,
// its head guard included).
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	began := make(chan time.Time, 1)
	stop := context.AfterFunc(ctx, func() { began <- time.Now() })
	err := p.connServer(p, p.flagged).Serve(ctx, ln, p.drainFor())
	if !stop() { // ctx ended: the drain began then
		p.drain(<-began)
	} else {
		p.Close()
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("serve proxy: %w", err)
	}
	if err != nil {
		return fmt.Errorf("shut down proxy: %w", err)
	}
	return nil
}

// connServer serves the HTTP/1.1 requests of sandbox connections with h, and those whose head
// the guard refused with flagged; a head refused before any request exists is answered with
// the proxy's JSON refusal and audited as http.rejected.
func (p *Proxy) connServer(h http.Handler, flagged func(http.ResponseWriter, *http.Request, *call.Refusal)) *httpconn.Server {
	l := p.cfg.Limits
	return &httpconn.Server{Handler: h, Flagged: flagged, Reject: p.refuseConn,
		Refusal:        func(rf *call.Refusal) *http.Response { return refusalResponse(nil, rf) },
		MaxHeaderBytes: l.MaxHeaderBytes, HeaderTimeout: l.ClientHandshakeTimeout.D(), IdleTimeout: l.TunnelIdleTimeout.D()}
}

// Close closes every tunnel and intercepted connection and the idle upstream connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	for _, u := range p.routes {
		u.tr.CloseIdleConnections()
	}
	for _, h := range p.hosts {
		if h.up != nil {
			h.up.tr.CloseIdleConnections()
		}
	}
	p.plain.tr.CloseIdleConnections()
}

// CAPEM returns the CA certificate sandboxes trust, or nil when nothing is intercepted.
func (p *Proxy) CAPEM() []byte {
	if p.ca == nil {
		return nil
	}
	return p.ca.CertPEM()
}

// ServeHTTP dispatches: CONNECT to the forward proxy, /routes/NAME/... to the route,
// absolute-URI http:// requests to plain forwarding; anything else is 404.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := identity.FromRemoteAddr(p.opts.Identity, r.RemoteAddr)
	if !id.Known {
		p.refuseUnknown(w, r, id)
		return
	}
	switch {
	case r.Method == http.MethodConnect:
		p.gp.ServeHTTP(w, r)
	case r.URL.IsAbs():
		p.serveForward(w, r, id)
	case strings.HasPrefix(r.URL.Path, routePrefix):
		p.serveRoute(w, r, id)
	default:
		p.serve(w, r, id, audit.KindHTTPRequest, refusing(call.Refuse(call.CodeNoRoute, "not a proxy request and no /routes/NAME/ prefix")))
	}
}

// refuseUnknown answers a caller whose address maps to no sandbox before anything of its
// request is read, dialled or decided, exactly as the gateway's guard does: 403 unknown_caller,
// an http.rejected event under the per-source rejection budget (unknown_caller is a security
// code, so a flood of noise never hides it), the event's identity saying which link of the
// chain did not hold.
func (p *Proxy) refuseUnknown(w http.ResponseWriter, r *http.Request, id identity.Identity) {
	rf := call.Refuse(call.CodeUnknownCaller, "caller is not a known sandbox")
	rf = p.core.Reject(r.Context(), audit.KindHTTPRejected, id, audit.Target{Method: r.Method, Host: r.Host}, rf)
	writeRefusal(w, rf, p.routeAPI(r) == config.APIOpenAI)
}

// routeAPI is the API of the route r names (/routes/NAME/...), or "" for none.
func (p *Proxy) routeAPI(r *http.Request) string {
	rest, ok := strings.CutPrefix(r.URL.Path, routePrefix)
	if !ok || r.URL.IsAbs() {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	if up := p.routes[name]; up != nil {
		return up.api
	}
	return ""
}

// flagged answers a request on the listener whose head the guard refused.
func (p *Proxy) flagged(w http.ResponseWriter, r *http.Request, rf *call.Refusal) {
	p.serve(w, r, identity.FromRemoteAddr(p.opts.Identity, r.RemoteAddr), audit.KindHTTPRejected, refusing(rf))
}

// refuseConn audits a head refused before any request exists (malformed, cut short, timed out,
// far too large), and returns the refusal to answer.
func (p *Proxy) refuseConn(c net.Conn, rf *call.Refusal) *call.Refusal {
	return p.core.Reject(context.Background(), audit.KindHTTPRejected, identity.FromRemoteAddr(p.opts.Identity, c.RemoteAddr().String()), audit.Target{}, rf)
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// acquireTunnel counts a tunnel against the sandbox's cap.
func (p *Proxy) acquireTunnel(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tunnels[key] >= p.cfg.Limits.TunnelsPerSandbox {
		return false
	}
	p.tunnels[key]++
	return true
}

func (p *Proxy) releaseTunnel(key string) {
	p.mu.Lock()
	if p.tunnels[key]--; p.tunnels[key] <= 0 {
		delete(p.tunnels, key)
	}
	p.mu.Unlock()
}
