package proxy

import (
	"crypto/tls"
	"net/http"
	"time"

	"github.com/sandgate/sandgate/config"
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
	cred         *config.ProxyCredential
	allowPrivate bool
	tr           *http.Transport
}

// newUpstream builds the upstream's transport: keep-alive pools sized for many sandboxes
// sharing one upstream, HTTP/2 where the upstream offers it, every connection through the
// dial guard, and bounded dial, TLS, response-header and idle times. Redirects are never
// followed (a Transport does not follow them).
func (p *Proxy) newUpstream(scheme string, addr hostport.Addr, basePath, route, api string, cred *config.ProxyCredential, allowPrivate bool) *upstream {
	l := p.cfg.Limits
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            p.guard.dialContext(allowPrivate),
		TLSClientConfig:        &tls.Config{RootCAs: p.opts.UpstreamRoots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           512,
		MaxIdleConnsPerHost:    128,
		IdleConnTimeout:        l.IdleConnTimeout.D(),
		TLSHandshakeTimeout:    l.TLSHandshakeTimeout.D(),
		ResponseHeaderTimeout:  l.ResponseHeaderTimeout.D(),
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
		WriteBufferSize:        32 << 10,
		ReadBufferSize:         32 << 10,
	}
	return &upstream{scheme: scheme, addr: addr, basePath: basePath, route: route, api: api, cred: cred, allowPrivate: allowPrivate, tr: tr}
}

// exchangeTransport sends a request through the transport of the exchange it belongs to.
type exchangeTransport struct{}

func (exchangeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return exchangeFrom(r.Context()).up.tr.RoundTrip(r)
}
