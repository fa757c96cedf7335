package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

// sandboxReads holds every byte a sandbox read from the proxy in this package's tests: the
// harness's sandbox-side connections (rawClient, client, sandboxTLS inside tunnels) record what
// they read into it, and curl's output is added. TestMain fails the run when any of it betrays
// a credential value a harness gave the proxy (security invariant 1, over the whole suite).
var sandboxReads = respguardtest.NewReads()

func TestMain(m *testing.M) { sandboxReads.Run(m) }

// sandboxTLS is a sandbox's TLS client inside an intercepted tunnel to host; what it reads is
// recorded in the clear.
func (h *harness) sandboxTLS(t testing.TB, c net.Conn, host string) net.Conn {
	return sandboxReads.Conn(t.Name()+" (tunnel)", tls.Client(c, &tls.Config{ServerName: host, RootCAs: h.sandgateRoots(t)}))
}

// client is an HTTP client of the sandbox at from (a loopback address), for base-URL routes
// and plain-HTTP forwarding; what it reads is recorded.
func (h *harness) client(t testing.TB, from string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return sandboxReads.Conn(t.Name(), c), nil
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}
