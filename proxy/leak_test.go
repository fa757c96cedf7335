package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"testing"
	"time"
)

// sandboxReads holds every byte a sandbox read from the proxy in this package's tests: the
// harness's sandbox-side connections (rawClient, client, sandboxTLS inside tunnels) tee what
// they read into it, and curl's output is added. TestMain fails the run when any of it holds a
// credential value a harness gave the proxy (security invariant 1, over the whole suite).
var sandboxReads = &readRecorder{secrets: map[string]bool{}}

type readRecorder struct {
	mu      sync.Mutex
	streams []*bytes.Buffer
	names   []string
	secrets map[string]bool
}

// conn returns c with everything read from it recorded under name.
func (r *readRecorder) conn(name string, c net.Conn) net.Conn {
	return &teeConn{Conn: c, rec: r, buf: r.stream(name)}
}

func (r *readRecorder) stream(name string) *bytes.Buffer {
	buf := &bytes.Buffer{}
	r.mu.Lock()
	r.streams = append(r.streams, buf)
	r.names = append(r.names, name)
	r.mu.Unlock()
	return buf
}

// add records bytes a sandbox received by other means (a curl's output).
func (r *readRecorder) add(name string, b []byte) {
	buf := r.stream(name)
	r.mu.Lock()
	buf.Write(b)
	r.mu.Unlock()
}

// secret registers a credential value the proxy under test holds.
func (r *readRecorder) secret(v string) {
	r.mu.Lock()
	r.secrets[v] = true
	r.mu.Unlock()
}

// leaks names every recorded stream that holds a secret, raw or base64 (standard or URL).
func (r *readRecorder) leaks() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for v := range r.secrets {
		forms := []string{v}
		if len(v) >= minBodySecret {
			forms = append(forms, base64Needles(v)...)
		}
		for i, s := range r.streams {
			for _, f := range forms {
				if bytes.Contains(s.Bytes(), []byte(f)) {
					out = append(out, fmt.Sprintf("%s holds a credential (as %q)", r.names[i], f))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

type teeConn struct {
	net.Conn
	rec *readRecorder
	buf *bytes.Buffer
}

func (c *teeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.rec.mu.Lock()
		c.buf.Write(b[:n])
		c.rec.mu.Unlock()
	}
	return n, err
}

// CloseWrite half-closes a TCP connection, for tests that end one direction of a tunnel.
func (c *teeConn) CloseWrite() error { return c.Conn.(interface{ CloseWrite() error }).CloseWrite() }

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaks := sandboxReads.leaks(); len(leaks) > 0 {
			fmt.Fprintln(os.Stderr, "FAIL: a sandbox received a credential value:")
			for _, l := range leaks {
				fmt.Fprintln(os.Stderr, "  "+l)
			}
			code = 1
		}
	}
	os.Exit(code)
}

// sandboxTLS is a sandbox's TLS client inside an intercepted tunnel to host; what it reads is
// recorded in the clear.
func (h *harness) sandboxTLS(t testing.TB, c net.Conn, host string) net.Conn {
	return sandboxReads.conn(t.Name()+" (tunnel)", tls.Client(c, &tls.Config{ServerName: host, RootCAs: h.sandgateRoots(t)}))
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
		return sandboxReads.conn(t.Name(), c), nil
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}
