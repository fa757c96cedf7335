package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/admission"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/mcpsessions"
	"github.com/sandgate/sandgate/internal/pins"
	"github.com/sandgate/sandgate/internal/respguard"
)

// Options are the gateway's dependencies. Config, Identity, and Core (or Policy and Audit) are
// required.
type Options struct {
	Config   config.Gateway
	Identity identity.Resolver
	// Core is the request path shared with the proxy. nil builds one from Policy, Audit,
	// Admission, Meters, Tracer and Log (tests and embedded use).
	Core        *call.Core
	Policy      call.Decider
	Audit       audit.Recorder
	Credentials *credential.Store
	Meters      metric.MeterProvider
	Log         *slog.Logger
	// Transport is the pooled transport of every HTTP upstream; nil builds one.
	Transport http.RoundTripper
	// Admission counts tools/call, resources/read and prompts/get against the caller's budgets
	// and adds its usage and grants to the policy input; nil counts nothing and adds no grants.
	Admission *admission.Admission
	// Sessions shares sandbox sessions with other replicas, so that a session continues on any
	// replica its requests reach; nil keeps them on this one.
	Sessions mcpsessions.Store
	// Tracer starts a span per call whose traceparent reaches HTTP upstreams; nil makes none.
	Tracer trace.TracerProvider

	// now is the sessions' clock (idle timeouts, shared refreshes); nil is time.Now. Tests set it.
	now func() time.Time
	// Catalogs keeps each upstream's last listed catalog, so that one that is down at start
	// keeps its tools listed (lastknown.go); nil keeps none.
	Catalogs CatalogStore
	// Pins are the reviewed tool definitions (pins.go); nil pins none: every tool is shown.
	Pins pins.Source
}

// Gateway is the MCP side of Sandgate: one Streamable HTTP endpoint for every sandbox in front
// of every configured upstream. See the package documentation for what it checks.
type Gateway struct {
	opts      Options
	log       *slog.Logger
	handler   http.Handler
	sessions  *mcpsessions.Sessions
	upstreams []*upstream
	core      *call.Core
	inflight  *inflight
	sandboxes *sandboxRegistry
	asks      *pendingAsks
	subs      *subscriptions
	listens   *listeners
	parked    *parkedCalls
	sealer    *stateSealer
	tasks     *taskOwners
	events    *mcpsessions.Events
	guard     *respguard.Source // the credentials no byte to a sandbox may hold
	dropped   metric.Int64Counter

	// view is the catalog every list is filtered from (catalog.go); rebuild replaces it whole.
	view      atomic.Pointer[view]
	rebuildMu sync.Mutex

	cancel context.CancelFunc
	wg     sync.WaitGroup

	// streams ends the sandboxes' standalone GET and listen streams when the listener starts
	// draining: they are no call waiting for an answer, and would hold the drain to its bound.
	streams    context.Context
	endStreams context.CancelFunc
	// unseen counts the upstreams of which no catalog is known yet (lastknown.go).
	unseen atomic.Int64
	pins   *pins.Gate
}

// New builds the gateway. Upstreams are not contacted until Start.
func New(opts Options) (*Gateway, error) {
	switch {
	case opts.Identity == nil:
		return nil, errors.New("gateway: Options.Identity is required")
	case opts.Core == nil && (opts.Policy == nil || opts.Audit == nil):
		return nil, errors.New("gateway: Options.Core (or Policy and Audit) is required")
	}
	setDefaults(&opts)
	if opts.Core == nil {
		core, err := call.New(call.Options{Policy: opts.Policy, Audit: opts.Audit, Admission: opts.Admission,
			Credentials: opts.Credentials, Meters: opts.Meters, Tracer: opts.Tracer, Log: opts.Log})
		if err != nil {
			return nil, err
		}
		opts.Core = core
	}
	events, _ := opts.Sessions.(mcpsessions.EventLog) // Redis keeps both
	g := &Gateway{opts: opts, log: opts.Log, core: opts.Core, inflight: newInflight(), subs: newSubscriptions(),
		asks: newPendingAsks(), listens: newListeners(), parked: newParkedCalls(), sealer: newStateSealer(), tasks: newTaskOwners()}
	g.view.Store(&view{})
	g.pins = pins.NewGate(opts.Pins, opts.Config.Unpinned)
	g.sandboxes = newSandboxRegistry(g)
	g.streams, g.endStreams = context.WithCancel(context.Background())
	hc := &http.Client{Transport: replyTransport{tracingTransport{opts.Transport}}}
	var refs []*config.CredentialRef
	for _, uc := range opts.Config.Upstreams {
		refs = append(refs, uc.Credential)
	}
	// Every credential of the store counts as injected: an upstream's own (credential_env)
	// as much as the ones Sandgate sends.
	g.guard = respguard.NewSource(opts.Credentials, refs...)
	g.events = mcpsessions.NewEvents(events, opts.Config.SessionIdleTimeout.D(), opts.Log)
	hooks := upstreamHooks{catalogChanged: g.rebuild, conn: g.connHooks, capabilities: g.upstreamCapabilities, listed: g.catalogListed}
	for _, uc := range opts.Config.Upstreams {
		uhc := &http.Client{Transport: newBoundedTransport(hc.Transport, uc)}
		u := newUpstream(uc, opts.Credentials, uhc, hooks, opts.Config.SessionIdleTimeout.D(), opts.Log)
		u.guard, u.inflight = g.guard, g.inflight
		u.subscribed = func() []string { return g.subscribedURIs(u) }
		g.upstreams = append(g.upstreams, u)
	}
	g.sessions = mcpsessions.NewSessions(opts.Config.SessionIdleTimeout.D(), opts.Sessions, g.endSession, opts.Log, opts.now)
	meter := opts.Meters.Meter("github.com/sandgate/sandgate/gateway")
	if err := g.registerBreakerMetric(meter); err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	var err error
	if g.dropped, err = meter.Int64Counter("sandgate.gateway.notifications.dropped",
		metric.WithDescription("Notifications of upstream sessions dropped over max_notification_rate, by upstream")); err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	if _, err := meter.Int64ObservableGauge("sandgate.gateway.sessions",
		metric.WithDescription("Sandbox MCP sessions this replica holds"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(g.sessions.Count()))
			return nil
		})); err != nil {
		return nil, fmt.Errorf("gateway metrics: %w", err)
	}
	g.handler = newGuard(g)
	g.fromLastKnown()
	return g, nil
}

// fromLastKnown starts the catalog from what the upstreams listed last (lastknown.go) and
// counts those never seen.
func (g *Gateway) fromLastKnown() {
	g.loadCatalogs()
	for _, u := range g.upstreams {
		if !u.seen() {
			g.unseen.Add(1)
		}
	}
	if int(g.unseen.Load()) < len(g.upstreams) {
		g.rebuild()
	}
}

// catalogListed saves what an upstream listed and counts it as seen.
func (g *Gateway) catalogListed(u *upstream, c catalog, first bool) {
	if first {
		g.unseen.Add(-1)
	}
	g.saveCatalog(u, c) // on the upstream's supervisor: bounded by catalogTimeout
}

// setDefaults fills in the options left zero.
func setDefaults(opts *Options) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Meters == nil {
		opts.Meters = noop.NewMeterProvider()
	}
	if opts.Tracer == nil {
		opts.Tracer = tracenoop.NewTracerProvider()
	}
	if opts.Credentials == nil {
		opts.Credentials = credential.FromValues(nil)
	}
	if opts.Config.MaxBodyBytes == 0 {
		opts.Config.MaxBodyBytes = 4 << 20
	}
	if opts.Config.BodyTimeout == 0 {
		opts.Config.BodyTimeout = config.Duration(call.DefaultBodyTiming.Timeout)
	}
	if opts.Config.MinBodyRate == 0 {
		opts.Config.MinBodyRate = call.DefaultBodyTiming.MinRate
	}
	if opts.Config.MaxSessionsPerSandbox == 0 {
		opts.Config.MaxSessionsPerSandbox = 64
	}
	if opts.Config.MaxSessions == 0 {
		opts.Config.MaxSessions = 50000
	}
	if opts.Config.SessionIdleTimeout == 0 {
		opts.Config.SessionIdleTimeout = config.Duration(30 * time.Minute)
	}
	ups := make([]config.Upstream, len(opts.Config.Upstreams))
	for i, u := range opts.Config.Upstreams {
		if u.Sessions == "" {
			u.Sessions = config.SessionsPerSandbox
		}
		if u.MaxSessions == 0 {
			u.MaxSessions = 256
		}
		u.ApplyBounds()
		if u.Breaker.Failures == 0 {
			u.Breaker.Failures = defaultBreakerFailures
		}
		if u.Breaker.OpenFor == 0 {
			u.Breaker.OpenFor = config.Duration(defaultBreakerOpenFor)
		}
		ups[i] = u
	}
	opts.Config.Upstreams = ups
	if opts.Transport == nil {
		opts.Transport = &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   true,
			// An upstream's response head is read whole before its body's bounds apply: the
			// egress proxy's bound, not net/http's default of 10 MiB for each response.
			MaxResponseHeaderBytes: maxUpstreamHeaderBytes,
			// Every coding is respguard.Decode's (bounds.go): the transport's own gzip decoding
			// reads only the first Content-Encoding line (issue 59).
			DisableCompression: true,
		}
	}
}

// Start connects to every upstream in the background and keeps reconnecting until Close.
// Sandgate serves while upstreams are down; their last known tools stay listed meanwhile, and
// their calls answer upstream_unavailable (lastknown.go).
func (g *Gateway) Start(ctx context.Context) {
	ctx, g.cancel = context.WithCancel(ctx)
	for _, u := range g.upstreams {
		g.wg.Go(func() { u.run(ctx) })
	}
	g.wg.Go(func() { g.sessions.Sweep(ctx) })
	g.wg.Go(func() { g.events.Run(ctx) })
	g.wg.Go(func() { g.parked.sweep(ctx) })
	g.wg.Go(func() { g.watchPins(ctx) })
}

// Close stops the upstreams (stdio servers are terminated) and ends every session.
func (g *Gateway) Close() {
	if g.cancel != nil {
		g.cancel()
	}
	g.wg.Wait()
	g.endStreams()
}

// Handler serves /mcp.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Ready is nil when every upstream is connected and its circuit breaker closed; otherwise it
// names each one that is not and why. The gateway serves either way.
func (g *Gateway) Ready() error {
	var errs []error
	for _, u := range g.upstreams {
		if err := u.health(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// connHooks routes what one upstream connection sends (route.go): the shared connection (sid
// "") or the upstream session of sandbox session sid. Its notifications and requests share the
// connection's budget (max_notification_rate): the excess is dropped (a request: refused).
func (g *Gateway) connHooks(u *upstream, sid string) connHooks {
	lim := notificationLimiter(u.cfg)
	attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("upstream", u.cfg.Name)))
	return connHooks{
		notify: func(in inbound) {
			if !lim.Allow() {
				g.dropped.Add(context.Background(), 1, attrs)
				return
			}
			g.upstreamMessage(u, sid, in)
		},
		request: func(ctx context.Context, in inbound) clientReply {
			if !lim.Allow() {
				g.dropped.Add(context.Background(), 1, attrs)
				return errorReply(codeInternalError, "too many messages from this upstream session")
			}
			return g.upstreamRequest(ctx, u, sid, in)
		},
		attribute: func(cli *client.Client) *inflightCall { return g.inflight.on(u, cli, sid) },
	}
}

// upstreamCapabilities are the client capabilities the upstream session of sandbox session sid
// declares: the sandbox's own (those of every client Sandgate serves, while unknown).
func (g *Gateway) upstreamCapabilities(sid string) mcp.ClientCapabilities {
	if rest, ok := strings.CutPrefix(sid, modernKeyPrefix); ok { // a 2026-07-28 sandbox's: its class
		class, _, _ := strings.Cut(rest, "/")
		k, _ := strconv.Atoi(class)
		return capabilityClass(k).capabilities()
	}
	if s := g.sandboxes.get(sid); s != nil {
		if caps, ok := s.capabilities(); ok {
			return caps
		}
	}
	return sharedCapabilities
}

// endUpstreamSessions closes the upstream sessions of sandbox session id.
func (g *Gateway) endUpstreamSessions(id string) {
	for _, u := range g.upstreams {
		u.endSession(id)
	}
}

// endSession drops what the gateway keeps for a session that ended (DELETE, here or on another
// replica) or expired: its calls are cancelled, its upstream sessions closed.
func (g *Gateway) endSession(id string) {
	g.sandboxes.close(id)
	g.endUpstreamSessions(id)
	g.subs.drop(id)
	g.events.Purge(id)
}

func (g *Gateway) String() string { return fmt.Sprintf("gateway(%d upstreams)", len(g.upstreams)) }
