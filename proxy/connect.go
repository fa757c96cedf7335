package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
	"github.com/sandgate/sandgate/proxy/hostport"
)

// handleConnect decides a CONNECT (policy kind http.connect) and picks how the tunnel is
// handled: refused (with a JSON reason), intercepted or relayed. A refused CONNECT is audited
// here; an accepted one is audited when its tunnel closes.
func (p *Proxy) handleConnect(host string, gctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	r := gctx.Req
	x := &exchange{p: p}
	spec := call.Spec{Kind: audit.KindHTTPConnect, Identity: identity.FromRemoteAddr(p.opts.Identity, r.RemoteAddr), Target: requestTarget(r)}
	return call.Run(r.Context(), p.core, spec, call.Steps[*goproxy.ConnectAction]{
		Ask: func(_ context.Context, cl *call.Call) (call.Question, *call.Refusal) {
			x.c = cl
			return p.askConnect(x, host)
		},
		Act: func(_ context.Context, _ *call.Call, g call.Grant) (*goproxy.ConnectAction, call.End) {
			return p.connect(x, g)
		},
		Refused: func(rf *call.Refusal) *goproxy.ConnectAction {
			x.status = rf.Status()
			gctx.Resp = refusalResponse(r, rf)
			return goproxy.RejectConnect
		},
	}), host
}

// askConnect is a CONNECT's question: its destination.
func (p *Proxy) askConnect(x *exchange, host string) (call.Question, *call.Refusal) {
	dest, err := hostport.Parse(host, 443)
	if err != nil {
		return call.Question{}, call.Refuse(call.CodeBadHost, "%v", err)
	}
	x.dest = dest
	x.c.Describe(audit.Target{Host: auditHost(dest, "https")})
	in := &policy.Input{Kind: audit.KindHTTPConnect, Identity: x.c.Identity(),
		HTTP: &policy.HTTP{Method: http.MethodConnect, Host: dest.Host, Port: dest.Port, MaxTokens: -1}}
	return call.Question{Input: in, Admit: true, Opaque: true}, nil
}

// connect is an allowed CONNECT's act: the tunnel that carries the call on (its close ends it).
func (p *Proxy) connect(x *exchange, g call.Grant) (*goproxy.ConnectAction, call.End) {
	he := p.hosts[x.dest.String()]
	if he == nil {
		return nil, call.Refused(call.Refuse(call.CodeHostNotConfigured, "%s is not a configured proxy host (proxy.hosts)", x.dest))
	}
	key := x.c.Identity().Key()
	if !p.acquireTunnel(key) {
		return nil, call.Refused(call.Refuse(call.CodeTooManyTunnels, "sandbox has %d open tunnels, the limit", p.cfg.Limits.TunnelsPerSandbox))
	}
	end := g.Later()
	return &goproxy.ConnectAction{Action: goproxy.ConnectHijack, Hijack: func(_ *http.Request, client net.Conn, _ *goproxy.ProxyCtx) {
		p.m.tunnels.Add(context.Background(), 1)
		cc := &countConn{Conn: client, in: &x.c.BytesIn, out: &x.c.BytesOut}
		closed := func() {
			p.untrack(cc)
			_ = cc.Close()
			if p.closing() {
				x.c.Note(call.CodeShutdown) // cut by the end of the shutdown drain
			}
			end(x.end())
			p.m.tunnels.Add(context.Background(), -1)
			p.releaseTunnel(key)
		}
		if !p.track(cc) {
			rf := call.Refuse(call.CodeShuttingDown, "the proxy is shutting down")
			x.c.NoteFailure(rf)
			x.status = rf.Status()
			closed()
			return
		}
		if he.cfg.Mode == config.ModeIntercept {
			p.intercept(cc, x, he, closed)
			return
		}
		defer closed()
		p.tunnel(cc, x, he)
	}}, call.Handed()
}

func refusalResponse(r *http.Request, rf *call.Refusal) *http.Response {
	b := refusalBody(rf, false)
	status := rf.Status()
	h := http.Header{"Content-Type": {"application/json"}, "Proxy-Status": {proxyStatus(rf)}}
	rf.SetHeaders(h)
	return &http.Response{StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		ProtoMajor: 1, ProtoMinor: 1, Request: r, Close: true, ContentLength: int64(len(b)),
		Header: h, Body: io.NopCloser(strings.NewReader(string(b)))}
}

func writeRawRefusal(c net.Conn, rf *call.Refusal) {
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = refusalResponse(nil, rf).Write(c)
}

// tunnel dials the checked destination and relays bytes until either side closes, the client
// sends nothing within the handshake timeout, or the tunnel is idle for the idle timeout.
func (p *Proxy) tunnel(client net.Conn, x *exchange, he *hostEntry) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	up, _, err := p.guard.Dial(ctx, x.dest, he.cfg.AllowPrivate)
	if err != nil {
		rf := upstreamRefusal(err)
		writeRawRefusal(client, rf)
		// The tunnel's closing finishes the call; only the outcome is set here.
		if rf.Class() == call.ClassPolicy {
			x.c.NoteRefusal(rf)
		} else {
			x.c.NoteFailure(rf)
		}
		x.status = rf.Status()
		return
	}
	defer up.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	x.status = http.StatusOK
	if why := p.relay(client, up); why != "" {
		x.c.Note(why)
	}
}

// relay copies both ways and closes both connections when either direction ends. It returns
// "client_silent" or "idle_timeout" when a timeout ended the tunnel.
//
// Each direction sets its read deadline once and moves it only when it expires while the
// other direction was busy: resetting it on every read cost a runtime timer update per
// packet, 3-5% of the CPU of a request inside a tunnel.
func (p *Proxy) relay(client, up net.Conn) string {
	idle := p.cfg.Limits.TunnelIdleTimeout.D()
	first := p.cfg.Limits.ClientHandshakeTimeout.D()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var why atomic.Value
	var once sync.Once
	closeBoth := func() { once.Do(func() { _ = client.Close(); _ = up.Close() }) }
	pipe := func(dst, src net.Conn, fromClient bool) {
		defer closeBoth()
		buf := copyBuffers.Get()
		defer copyBuffers.Put(buf)
		silent := fromClient // until the client's first byte, its wait is the handshake timeout
		wait := idle
		if silent {
			wait = first
		}
		_ = src.SetReadDeadline(time.Now().Add(wait))
		for {
			n, err := src.Read(buf)
			if n > 0 {
				now := time.Now()
				last.Store(now.UnixNano())
				if silent {
					silent = false
					_ = src.SetReadDeadline(now.Add(idle))
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					if silent {
						why.CompareAndSwap(nil, "client_silent")
						return
					}
					// Either direction's traffic keeps the tunnel alive: wait on from the
					// last byte seen.
					if until := time.Unix(0, last.Load()).Add(idle); time.Until(until) > 0 {
						_ = src.SetReadDeadline(until)
						continue
					}
					why.CompareAndSwap(nil, "idle_timeout")
				}
				return
			}
		}
	}
	done := make(chan struct{})
	go func() { pipe(up, client, true); close(done) }()
	pipe(client, up, false)
	<-done
	s, _ := why.Load().(string)
	return s
}

// intercept terminates TLS with a leaf certificate for the CONNECT target and serves the
// tunnel's requests on this goroutine (connServer), every request decided again. It calls
// closed once, when the tunnel is over. An open intercepted tunnel costs this one goroutine
// (with 10,000 sandboxes, 10,000 stacks grown by the TLS handshake) and no buffer while idle
// beyond its reader's.
func (p *Proxy) intercept(client net.Conn, x *exchange, he *hostEntry, closed func()) {
	served := false
	defer func() {
		if !served {
			closed()
		}
	}()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	x.status = http.StatusOK
	l := p.cfg.Limits
	_ = client.SetDeadline(time.Now().Add(l.ClientHandshakeTimeout.D()))
	tc := tls.Server(client, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return p.ca.Leaf(x.dest.Host)
		},
	})
	if err := tc.Handshake(); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			x.c.Note("client_silent")
		} else {
			x.c.Note("client_tls_handshake_failed")
		}
		return
	}
	_ = client.SetDeadline(time.Time{})
	t := &tunnelRequests{p: p, id: x.c.Identity(), dest: x.dest, he: he}
	srv := p.connServer(t, t.flagged)
	srv.Base = p.tunnelsDrain.base
	served = true
	defer func() {
		_ = tc.Close()
		closed()
	}()
	srv.ServeConn(tc)
}

// tunnelRequests serves the requests of one intercepted tunnel.
type tunnelRequests struct {
	p    *Proxy
	id   identity.Identity
	dest hostport.Addr
	he   *hostEntry
}

// serve runs one request of the tunnel as the proxy serves any (Proxy.serve), its target the
// CONNECT's destination.
func (t *tunnelRequests) serve(w http.ResponseWriter, r *http.Request, kind audit.Kind, ask func(context.Context, *exchange) (call.Question, *call.Refusal)) {
	t.p.serve(w, r, t.id, kind, func(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
		x.c.Describe(audit.Target{Host: auditHost(t.dest, "https")})
		x.up = t.he.up
		return ask(ctx, x)
	})
}

// flagged answers a request whose head the guard refused: a protocol-level rejection.
func (t *tunnelRequests) flagged(w http.ResponseWriter, r *http.Request, rf *call.Refusal) {
	t.serve(w, r, audit.KindHTTPRejected, refusing(rf))
}

func (t *tunnelRequests) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t.p.tunnelsDrain.inflight.Add(1)
	defer t.p.tunnelsDrain.inflight.Add(-1)
	t.serve(w, r, audit.KindHTTPRequest, func(ctx context.Context, x *exchange) (call.Question, *call.Refusal) {
		if r.URL.IsAbs() || !strings.HasPrefix(r.RequestURI, "/") {
			rf := call.Refuse(call.CodeAbsoluteURIInTunnel, "an absolute URI inside a CONNECT tunnel is refused; send origin-form requests")
			rf.Close = true
			return call.Question{}, rf
		}
		if !t.dest.Is(r.Host, 443) {
			if h, err := hostport.Parse(r.Host, 443); err != nil || h != t.dest {
				rf := call.Refuse(call.CodeHostMismatch, "request Host %q differs from the CONNECT target %s", truncateString(r.Host, 100), t.dest)
				rf.Close = true
				return call.Question{}, rf
			}
		}
		x.dest = t.dest
		return t.p.askForward(w, r, x, r.URL.EscapedPath())
	})
}

func truncateString(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// countConn counts the bytes of a tunnel: in is what the sandbox sent, out what it received.
type countConn struct {
	net.Conn
	in, out *atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}
