package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/proxy/hostport"
)

// upstream is one destination with its own pooled transport: a route, an intercepted host, or
// (with an empty addr) every plain-HTTP forward destination.
type upstream struct {
	scheme       string
	addr         hostport.Addr
	basePath     string // escaped, without trailing slash
	route        string
	api          string
	cred         *config.CredentialRef
	allowPrivate bool
	tr           *http.Transport
}

// newUpstream builds the upstream's transport: keep-alive pools sized for many sandboxes
// sharing one upstream, HTTP/2 where the upstream offers it, every connection through the
// dial guard, and bounded dial, TLS, response-header and idle times. Redirects are never
// followed (a Transport does not follow them). The transport decodes nothing: with compression
// on it asks for gzip itself and, when the first Content-Encoding line says gzip, decodes one
// layer and drops every line, so the codings of the other lines would reach the sandbox
// undecoded and unscanned. Sandgate asks for gzip itself where it reads bodies (rewrite) and
// decodes every layer (respguard.Decode).
func (p *Proxy) newUpstream(scheme string, addr hostport.Addr, basePath, route, api string, cred *config.CredentialRef, allowPrivate bool) *upstream {
	l := p.cfg.Limits
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            p.pooledDial(upstreamName(route, addr), allowPrivate),
		TLSClientConfig:        &tls.Config{RootCAs: p.opts.UpstreamRoots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           512,
		MaxIdleConnsPerHost:    128,
		IdleConnTimeout:        l.IdleConnTimeout.D(),
		TLSHandshakeTimeout:    l.TLSHandshakeTimeout.D(),
		ResponseHeaderTimeout:  l.ResponseHeaderTimeout.D(),
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		DisableCompression:     true,
		WriteBufferSize:        32 << 10,
		ReadBufferSize:         32 << 10,
	}
	if cred != nil && p.opts.Credentials.Minted(cred.Name) {
		tr.HTTP2 = &http.HTTP2Config{MaxEncoderHeaderTableSize: noHeaderIndexing}
	}
	return &upstream{scheme: scheme, addr: addr, basePath: basePath, route: route, api: api, cred: cred, allowPrivate: allowPrivate, tr: tr}
}

// noHeaderIndexing is the HPACK dynamic table (in bytes) of the requests to an upstream whose
// credential is minted per run: no header field fits, so none is indexed (each is sent as a
// literal, its name indexed from the static table where it is there).
//
// A run's token is a header value no other run sends. In the table of the pooled HTTP/2
// connection each token was a new entry that evicted the others, every request: the encoder's
// table work (and the stack it grew) was the largest part of what a minted credential cost per
// request, about 4.5% of the route's CPU in the bench's profiles. RFC 7541 §7.1.3 advises
// against indexing credentials at all: an entry shared by every sandbox's requests on one
// connection is what a compression oracle probes. Go's HTTP/2 client cannot send one field
// never-indexed (it never sets hpack.HeaderField.Sensitive), so the table is off for the whole
// connection: the other headers are sent as literals too, a few hundred bytes a request.
const noHeaderIndexing = 1

// upstreamName labels an upstream's pool in metrics: its route name, else its host:port, else
// "forward" for the shared plain-HTTP pool.
func upstreamName(route string, addr hostport.Addr) string {
	switch {
	case route != "":
		return route
	case addr != (hostport.Addr{}):
		return addr.String()
	}
	return "forward"
}

// pooledDial dials through the dial guard and counts the connection while it is open
// (sandgate.proxy.upstream.connections): with keep-alive and HTTP/2 the pool stays small
// whatever the number of sandboxes, and this is where to see it.
func (p *Proxy) pooledDial(name string, allowPrivate bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := p.guard.dialContext(allowPrivate)
	attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("upstream", name)))
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		p.m.upstreamConns.Add(ctx, 1, attrs)
		return &countedConn{Conn: c, closed: func() { p.m.upstreamConns.Add(context.Background(), -1, attrs) }}, nil
	}
}

// countedConn runs closed once, on the first Close.
type countedConn struct {
	net.Conn
	once   sync.Once
	closed func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.closed)
	return err
}

// exchangeTransport sends a request through the transport of the exchange it belongs to.
type exchangeTransport struct{}

func (exchangeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return exchangeFrom(r.Context()).up.tr.RoundTrip(r)
}
