package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/breaker"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/mcpstdio"
	"github.com/sandgate/sandgate/internal/respguard"
)

// Backoff bounds for reconnecting to an upstream that is down.
const (
	backoffMin     = 100 * time.Millisecond
	backoffMax     = 15 * time.Second
	healthInterval = 2 * time.Second
)

// errUpstreamDown is returned for calls to an upstream that is not connected.
var errUpstreamDown = errors.New("upstream is not connected")

// upstreamHooks is how an upstream reports to the gateway.
type upstreamHooks struct {
	catalogChanged func()
	// listed receives every catalog the upstream listed (to save it, lastknown.go); first says
	// it is the first catalog known of the upstream since start.
	listed func(u *upstream, c catalog, first bool)
	// conn is what one connection to u reports to: the shared connection (sid "") or the
	// upstream session of sandbox session sid.
	conn func(u *upstream, sid string) connHooks
	// capabilities are the client capabilities the upstream session of sandbox session sid
	// declares.
	capabilities func(sid string) mcp.ClientCapabilities
}

// connHooks receive what one upstream connection sends that is not a response (route.go).
type connHooks struct {
	// notify handles a notification, in the order the connection received it.
	notify func(in inbound)
	// request answers a request to the client.
	request func(ctx context.Context, in inbound) clientReply
	// attribute is the call a stdio connection's message belongs to (its one pipe cannot say),
	// nil when none can be told.
	attribute func(cli *client.Client) *inflightCall
}

// upstream is one supervised MCP server connection, which lists the catalog and checks health,
// plus, for a stateful upstream in per-sandbox mode, one upstream session per sandbox
// session (sandboxSessions) for the sandboxes' requests. Server-to-client requests made while
// a call is in flight reach the sandbox session of that call.
//
// Security: requests to the upstream carry only what Sandgate builds: the JSON-RPC params it
// forwards and the configured credential header. No header a sandbox sent (Authorization
// included) is ever copied. A stdio server gets a clean environment: PATH, HOME, its
// configured env and its credential_env, nothing else of Sandgate's environment.
type upstream struct {
	cfg   config.Upstream
	creds *credential.Store
	http  *http.Client
	hooks upstreamHooks
	log   *slog.Logger
	idle  time.Duration // a per-sandbox session unused this long is closed

	guard    *respguard.Source // what the errors a sandbox reads are scrubbed of
	inflight *inflight         // the gateway's calls in flight

	pool    sandboxSessions
	brk     *breaker.Breaker // calls' transport failures and timeouts (isolation.go)
	classes classLists       // the tools listed to clients without some capabilities

	mu        sync.RWMutex
	cli       *client.Client
	gen       uint64
	cat       catalog
	err       error
	downSince time.Time
	listed    bool // the catalog of the current connection has been listed
	// legacy is set when an upstream that negotiated 2026-07-28 then refused it: it is spoken
	// to on the newest legacy revision from then on.
	legacy bool

	kick    chan struct{} // reconnect now
	refresh chan struct{} // re-list the catalog

	// stopListen ends the current subscriptions/listen stream (2026-07-28), which is opened
	// again; subscribed is the resources sandboxes subscribed to on the shared connection.
	stopListen context.CancelFunc
	subscribed func() []string

	// tried is closed when the first connection attempt ended; known is set once a catalog of
	// the upstream is known (saved from an earlier run, or listed); saved is the last catalog
	// saved (lastknown.go).
	tried     chan struct{}
	triedOnce sync.Once
	known     bool
	saveMu    sync.Mutex
	saved     []byte
}

func newUpstream(cfg config.Upstream, creds *credential.Store, hc *http.Client, hooks upstreamHooks, idle time.Duration, log *slog.Logger) *upstream {
	u := &upstream{cfg: cfg, creds: creds, http: hc, hooks: hooks, idle: idle, log: log.With("upstream", cfg.Name),
		pool: sandboxSessions{conns: map[string]*sandboxConn{}},
		err:  errors.New("not connected yet"), downSince: time.Now(),
		kick: make(chan struct{}, 1), refresh: make(chan struct{}, 1), tried: make(chan struct{})}
	u.brk = u.newBreaker()
	return u
}

// client returns the connected client and its generation, or errUpstreamDown.
func (u *upstream) client() (*client.Client, uint64, error) {
	u.mu.RLock()
	defer u.mu.RUnlock()
	if u.cli == nil {
		return nil, 0, fmt.Errorf("%w: %v", errUpstreamDown, u.err)
	}
	return u.cli, u.gen, nil
}

// isShared reports that cli is the shared connection.
func (u *upstream) isShared(cli *client.Client) bool {
	shared, _, _ := u.client()
	return shared == cli
}

// health is nil while connected with a closed breaker, else why not.
func (u *upstream) health() error {
	u.mu.RLock()
	defer u.mu.RUnlock()
	if u.cli == nil || !u.listed {
		return fmt.Errorf("upstream %s down since %s: %v", u.cfg.Name, u.downSince.UTC().Format(time.RFC3339), u.err)
	}
	return u.breakerHealth()
}

func (u *upstream) catalog() catalog {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.cat
}

// remember sets the catalog saved by an earlier run, until the upstream lists its own.
func (u *upstream) remember(c catalog) {
	u.mu.Lock()
	u.cat, u.known = c, true
	u.mu.Unlock()
}

// seen reports that a catalog of the upstream is known.
func (u *upstream) seen() bool {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.known
}

// broken reports that a call found the connection of generation gen unusable; the supervisor
// reconnects.
func (u *upstream) broken(gen uint64, err error) {
	u.mu.Lock()
	if u.cli == nil || u.gen != gen {
		u.mu.Unlock()
		return
	}
	old := u.cli
	u.cli, u.err, u.downSince, u.listed = nil, err, time.Now(), false
	u.mu.Unlock()
	u.log.Warn("upstream connection lost; reconnecting", "err", err)
	go old.Close()
	u.hooks.catalogChanged()
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

func (u *upstream) requestRefresh() {
	select {
	case u.refresh <- struct{}{}:
	default:
	}
}

// run supervises the connection until ctx ends: connect with backoff, list the catalog,
// re-list on list_changed, ping to notice a dead server.
func (u *upstream) run(ctx context.Context) {
	backoff := backoffMin
	ping := time.NewTicker(healthInterval)
	defer ping.Stop()
	defer func() {
		u.mu.Lock()
		c := u.cli
		u.cli, u.err = nil, errors.New("gateway closed")
		u.mu.Unlock()
		if c != nil {
			c.Close()
		}
		u.closeSessions(func(*sandboxConn) bool { return true })
	}()
	for ctx.Err() == nil {
		cli, gen, _ := u.client()
		if cli == nil {
			err := u.connect(ctx)
			u.triedOnce.Do(func() { close(u.tried) })
			if err != nil && ctx.Err() != nil {
				return // serve is stopping and cut the attempt short: nothing to retry or report
			}
			if err != nil {
				u.mu.Lock()
				u.err = err
				u.mu.Unlock()
				wait := jittered(backoff)
				u.log.Warn("upstream connect failed; retrying", "err", err, "retry_in", wait)
				select { // a kick left by the failed attempt itself must not cut the backoff short
				case <-u.kick:
				default:
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				case <-u.kick:
				}
				backoff = min(backoff*2, backoffMax)
				continue
			}
			backoff = backoffMin
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-u.kick:
		case <-u.refresh:
			if err := u.list(ctx, cli, gen); err != nil {
				u.broken(gen, fmt.Errorf("list catalog: %w", err))
			}
		case <-ping.C:
			u.closeIdleSessions()
			pctx, cancel := context.WithTimeout(ctx, u.cfg.ConnectTimeout.D())
			err := alive(pctx, cli)
			cancel()
			if err != nil && ctx.Err() == nil {
				u.broken(gen, fmt.Errorf("ping: %w", err))
			}
		}
	}
}

// alive checks that the upstream answers: ping on the legacy protocol; on 2026-07-28 and later,
// which removed ping, server/discover.
func alive(ctx context.Context, cli *client.Client) error {
	method := string(mcp.MethodPing)
	if mcp.IsModernProtocol(cli.ProtocolVersion()) {
		method = string(mcp.MethodServerDiscover)
	}
	_, err := rpc(ctx, cli, method, nil)
	return err
}

// connect opens the shared connection and lists the catalog.
func (u *upstream) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, u.cfg.ConnectTimeout.D())
	defer cancel()
	// The newest protocol revision both sides speak is negotiated (server/discover, falling
	// back to initialize); protocol_version pins one for upstreams that need it.
	version := u.cfg.ProtocolVersion
	u.mu.RLock()
	if u.legacy && version == "" {
		version = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	}
	u.mu.RUnlock()
	cli, err := u.dial(ctx, version, u.hooks.conn(u, ""), sharedCapabilities, true)
	if err != nil {
		return err
	}
	u.mu.Lock()
	u.gen++
	gen := u.gen
	u.cli, u.err = cli, nil
	u.mu.Unlock()
	if err := u.list(ctx, cli, gen); err != nil {
		var unsupported mcp.UnsupportedProtocolVersionError
		if mcp.IsModernProtocol(cli.ProtocolVersion()) && errors.As(err, &unsupported) {
			u.log.Warn("upstream negotiated 2026-07-28 but refuses it; speaking the legacy revision to it", "err", err)
			u.mu.Lock()
			u.legacy = true
			u.mu.Unlock()
		}
		u.broken(gen, fmt.Errorf("list catalog: %w", err))
		return fmt.Errorf("list catalog: %w", err)
	}
	if mcp.IsModernProtocol(cli.ProtocolVersion()) {
		go u.subscribe(cli)
	}
	u.log.Info("upstream connected", "tools", len(u.catalog().tools), "protocol_version", cli.ProtocolVersion())
	return nil
}

// sharedCapabilities are the client capabilities of the shared connection: every one a
// sandbox may have, so that the catalog holds every tool; a sandbox sees the ones its own
// capabilities let it (capabilities.go).
var sharedCapabilities = mcp.ClientCapabilities{
	Sampling:    &mcp.SamplingCapability{},
	Elicitation: &mcp.ElicitationCapability{},
	Roots: &struct {
		ListChanged bool `json:"listChanged,omitempty"`
	}{ListChanged: true},
}

// subscribe keeps the subscriptions/listen stream of a 2026-07-28 connection open for the list
// changes the upstream declares (which that revision sends nowhere else) and the resource
// updates sandboxes subscribed to, until the connection closes: a stream that ends is opened
// again after a backoff that grows while it keeps failing, and a change of the resources
// subscribed to opens it again with the new filter (resubscribe).
func (u *upstream) subscribe(cli *client.Client) {
	backoff := backoffMin
	for {
		f := u.listenFilter(cli)
		if f.IsEmpty() {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		u.mu.Lock()
		if u.cli != cli {
			u.mu.Unlock()
			cancel()
			return
		}
		u.stopListen = cancel
		u.mu.Unlock()
		start := time.Now()
		err := cli.Listen(ctx, f)
		resubscribed := ctx.Err() != nil
		cancel()
		u.mu.RLock()
		current := u.cli == cli
		u.mu.RUnlock()
		if !current {
			return
		}
		if resubscribed {
			continue
		}
		if time.Since(start) > backoffMax {
			backoff = backoffMin
		}
		wait := jittered(backoff)
		u.log.Debug("upstream subscriptions/listen ended; opening it again", "err", err, "retry_in", wait)
		time.Sleep(wait)
		backoff = min(backoff*2, backoffMax)
	}
}

// listenFilter is what the subscriptions/listen stream of cli asks for.
func (u *upstream) listenFilter(cli *client.Client) mcp.SubscriptionFilter {
	caps := cli.GetServerCapabilities()
	var f mcp.SubscriptionFilter
	f.ToolsListChanged = caps.Tools != nil && caps.Tools.ListChanged
	f.PromptsListChanged = caps.Prompts != nil && caps.Prompts.ListChanged
	f.ResourcesListChanged = caps.Resources != nil && caps.Resources.ListChanged
	if caps.Resources != nil && caps.Resources.Subscribe && u.subscribed != nil {
		f.ResourceSubscriptions = u.subscribed()
	}
	return f
}

// resubscribe opens the subscriptions/listen stream again, with the resources subscribed to now.
func (u *upstream) resubscribe() {
	u.mu.RLock()
	stop := u.stopListen
	u.mu.RUnlock()
	if stop != nil {
		stop()
	}
}

// dial starts a transport and initializes a session on it, declaring caps; with listen, the
// session's listening stream is opened (legacy HTTP revisions) before it returns.
func (u *upstream) dial(ctx context.Context, version string, h connHooks, caps mcp.ClientCapabilities, listen bool) (*client.Client, error) {
	var tr transport.Interface
	var uh *upstreamHTTP
	var stdio *mcpstdio.Transport
	if u.cfg.IsStdio() {
		s, err := mcpstdio.New(func(ctx context.Context) (*exec.Cmd, error) {
			return u.command(ctx, u.cfg.Command, nil, u.cfg.Args)
		}, u.cfg.MaxMessageBytes, readStdioMessage)
		if err != nil {
			return nil, err
		}
		tr, stdio = s, s
	} else {
		t, err := transport.NewStreamableHTTP(u.cfg.URL,
			transport.WithHTTPBasicClient(u.http),
			transport.WithHTTPHeaderFunc(u.headers),
			transport.WithHTTPLogger(u.log))
		if err != nil {
			return nil, fmt.Errorf("streamable HTTP transport for %s: %w", u.cfg.URL, err)
		}
		uh = newUpstreamHTTP(t, u, h)
		tr = uh
	}
	cli := client.NewClient(tr, client.WithProtocolVersion(version), client.WithClientCapabilities(caps))
	if stdio != nil {
		routeStdio(stdio, cli, h)
	}
	// The transport outlives the caller's timeout: start it with a context that lasts.
	if err := cli.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, fmt.Errorf("start transport: %w", err)
	}
	if stdio != nil {
		answerStdio(stdio, cli, h) // after Start, which sets mcp-go's own handler
	}
	// What mcp-go reads itself (the 2026-07-28 subscriptions/listen stream) is not part of a call.
	cli.OnNotification(func(n mcp.JSONRPCNotification) {
		if raw, err := json.Marshal(n); err == nil {
			if in, ok := parseInbound(raw); ok {
				h.notify(in)
			}
		}
	})
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = version
	init.Params.ClientInfo = clientInfo
	if _, err := cli.Initialize(ctx, init); err != nil {
		cli.Close()
		return nil, fmt.Errorf("initialize: %w", err)
	}
	legacy := !mcp.IsModernProtocol(cli.ProtocolVersion())
	// The upstream sends every log message; each sandbox session's own level filters them. On
	// 2026-07-28 and later the level travels in every request's _meta instead (rpc).
	if legacy && cli.GetServerCapabilities().Logging != nil {
		if _, err := rpc(ctx, cli, string(mcp.MethodSetLogLevel), mcp.SetLevelParams{Level: mcp.LoggingLevelDebug}); err != nil {
			u.log.Debug("upstream refused logging/setLevel", "err", err)
		}
	}
	if listen && legacy && uh != nil {
		uh.listen(ctx, cli.ProtocolVersion())
	}
	return cli, nil
}

// list fetches every list the upstream declares, verbatim, and publishes the catalog.
func (u *upstream) list(ctx context.Context, cli *client.Client, gen uint64) error {
	cat := catalog{meta: map[mcp.MCPMethod]json.RawMessage{}, ttl: map[mcp.MCPMethod]int64{}}
	caps := cli.GetServerCapabilities()
	declared := map[mcp.MCPMethod]bool{mcp.MethodToolsList: caps.Tools != nil, mcp.MethodPromptsList: caps.Prompts != nil,
		mcp.MethodResourcesList: caps.Resources != nil, mcp.MethodResourcesTemplatesList: caps.Resources != nil}
	for _, k := range listKinds {
		if !declared[k.method] {
			continue
		}
		entries, meta, ttl, err := listAll(ctx, cli, k)
		if err != nil {
			return err
		}
		*cat.entries(k) = entries
		if meta != nil {
			cat.meta[k.method] = meta
		}
		if ttl >= 0 {
			cat.ttl[k.method] = ttl
		}
	}
	u.mu.Lock()
	if u.gen != gen {
		u.mu.Unlock()
		return nil
	}
	first := !u.known
	u.cat, u.known = cat, true
	u.mu.Unlock()
	u.classes.reset()
	u.hooks.catalogChanged()
	if u.hooks.listed != nil {
		u.hooks.listed(u, cat, first)
	}
	// Ready only once the catalog is served: a sandbox sent here by readiness finds its tools.
	u.mu.Lock()
	if u.gen == gen {
		u.listed = true
	}
	u.mu.Unlock()
	return nil
}

// headers is the credential header of every request to an HTTP upstream, read at request
// time (a rotated credential applies at once; a minted one is the token of the call's run).
func (u *upstream) headers(ctx context.Context) map[string]string {
	c := u.cfg.Credential
	if c == nil {
		return nil
	}
	v, ok := call.CredentialValue(ctx, u.creds, c.Name)
	if !ok {
		return nil
	}
	return map[string]string{c.Header: c.Render(v)}
}

// waitConnected waits up to the connect timeout for the supervisor to reconnect.
func (u *upstream) waitConnected(ctx context.Context) error {
	deadline := time.NewTimer(u.cfg.ConnectTimeout.D())
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, _, err := u.client(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			_, _, err := u.client()
			return err
		case <-tick.C:
		}
	}
}

// streamEndedEarly reports a response stream the upstream ended before the response without
// an event ID to resume from (SEP-1699 polling without an event store): that request is lost,
// the connection is not.
func streamEndedEarly(err error) bool {
	return strings.Contains(err.Error(), "unexpected nil response")
}

// isTransportError tells a broken connection from a JSON-RPC error the upstream answered.
func isTransportError(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) || errors.Is(err, transport.ErrTransportClosed)
}
