package respguardtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/internal/respguard"
)

// Reads holds every byte sandboxes read in a package's tests, by stream: connections wrapped
// on the sandbox's side (Conn) or on Sandgate's (Listener: what Sandgate writes is what the
// sandbox reads), and bytes added by other means (a curl's output). Check, run from TestMain,
// fails the run when any of it betrays a credential value the tests registered (Secret), in any
// form the response guard looks for: security invariant 1 over the whole suite.
type Reads struct {
	mu      sync.Mutex
	streams []*bytes.Buffer
	names   []string
	secrets map[string]bool
}

// NewReads is an empty record.
func NewReads() *Reads { return &Reads{secrets: map[string]bool{}} }

// Secret registers a credential value the Sandgate under test holds.
func (r *Reads) Secret(v string) {
	r.mu.Lock()
	r.secrets[v] = true
	r.mu.Unlock()
}

func (r *Reads) stream(name string) *bytes.Buffer {
	buf := &bytes.Buffer{}
	r.mu.Lock()
	r.streams = append(r.streams, buf)
	r.names = append(r.names, name)
	r.mu.Unlock()
	return buf
}

func (r *Reads) record(buf *bytes.Buffer, b []byte) {
	r.mu.Lock()
	buf.Write(b)
	r.mu.Unlock()
}

// Add records bytes a sandbox received by other means.
func (r *Reads) Add(name string, b []byte) { r.record(r.stream(name), b) }

// Conn is c, a sandbox's connection, with everything read from it recorded under name.
func (r *Reads) Conn(name string, c net.Conn) net.Conn {
	return &readConn{Conn: c, r: r, buf: r.stream(name)}
}

// Listener is ln, Sandgate's listener for sandboxes, with everything written to each accepted
// connection recorded under name.
func (r *Reads) Listener(name string, ln net.Listener) net.Listener {
	return &listener{Listener: ln, r: r, name: name}
}

// Leaks names every recorded stream that betrays a secret.
func (r *Reads) Leaks() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var vals []string
	for v := range r.secrets {
		vals = append(vals, v)
	}
	n := respguard.Build(vals, nil)
	var out []string
	for i, s := range r.streams {
		raw := false
		for _, v := range vals {
			raw = raw || bytes.Contains(s.Bytes(), []byte(v))
		}
		if raw || n.Betrays(s.Bytes()) {
			out = append(out, fmt.Sprintf("%s holds a credential", r.names[i]))
		}
	}
	sort.Strings(out)
	return out
}

// Check is TestMain's end: code, or 1 with the leaks printed when the run passed but a
// sandbox read a credential.
func (r *Reads) Check(code int) int {
	if code != 0 {
		return code
	}
	if leaks := r.Leaks(); len(leaks) > 0 {
		fmt.Fprintln(os.Stderr, "FAIL: a sandbox received a credential value:")
		for _, l := range leaks {
			fmt.Fprintln(os.Stderr, "  "+l)
		}
		return 1
	}
	return 0
}

// Run is a TestMain that checks r after the tests.
func (r *Reads) Run(m *testing.M) { os.Exit(r.Check(m.Run())) }

type readConn struct {
	net.Conn
	r   *Reads
	buf *bytes.Buffer
}

func (c *readConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.r.record(c.buf, b[:n])
	}
	return n, err
}

// CloseWrite half-closes a TCP connection, for tests that end one direction of a tunnel.
func (c *readConn) CloseWrite() error { return c.Conn.(interface{ CloseWrite() error }).CloseWrite() }

type listener struct {
	net.Listener
	r    *Reads
	name string
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &writeConn{Conn: c, r: l.r, buf: l.r.stream(l.name)}, nil
}

type writeConn struct {
	net.Conn
	r   *Reads
	buf *bytes.Buffer
}

func (c *writeConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.r.record(c.buf, b[:n])
	}
	return n, err
}

// CloseWrite half-closes the TCP connection.
func (c *writeConn) CloseWrite() error { return c.Conn.(interface{ CloseWrite() error }).CloseWrite() }
