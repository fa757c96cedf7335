package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sandgate/sandgate/internal/call"
)

// tunnelServer serves the HTTP/1.1 requests of one intercepted tunnel, one after another on the
// goroutine that accepted the tunnel: goproxy's own interception loop (read a head with
// http.ReadRequest, answer it, repeat), with Sandgate's head guard, deadlines and refusals.
//
// It replaces a net/http server per tunnel. That server ran a background read for every request
// (a goroutine, a read that parks, and a deadline to wake it: about 6% of an intercepted
// request's CPU) to notice a client that goes away mid-request. Here a client that goes away is
// noticed when its response is written: a streamed response stops at its next write, and a
// response still awaited upstream is finished and then dropped.
//
// What net/http's server checks beyond http.ReadRequest is checked here too (version, Host,
// header names and values, Expect), and every head it refuses is one audit event: through the
// head guard's report, as on the proxy listener.
type tunnelServer struct {
	p       *Proxy
	conn    net.Conn // the tunnel's TLS connection; responses are written here
	g       *headGuard
	br      *bufio.Reader
	lim     limitReader
	h       func(w http.ResponseWriter, r *http.Request)
	remote  string
	maxHead int // bytes http.ReadRequest may read for one head
	headT   time.Duration
	idleT   time.Duration
}

// maxDrain is how much of a request body the handler left unread is read to keep the tunnel
// open for the next request (net/http's server reads as much); with more left it closes.
const maxDrain = 256 << 10

func (p *Proxy) newTunnelServer(tc net.Conn, g *headGuard, h func(http.ResponseWriter, *http.Request)) *tunnelServer {
	l := p.cfg.Limits
	s := &tunnelServer{p: p, conn: tc, g: g, h: h, remote: tc.RemoteAddr().String(),
		// as net/http's server with MaxHeaderBytes 2*limit: heads between limit and this are
		// refused by the guard's flag, larger ones when the read stops here.
		maxHead: 2*l.MaxHeaderBytes + 4096,
		headT:   l.ClientHandshakeTimeout.D(), idleT: l.TunnelIdleTimeout.D()}
	s.lim.r, s.lim.n = g, 1<<63-1
	s.br = bufio.NewReaderSize(&s.lim, 4096)
	return s
}

// serve answers requests until the client closes, a timeout or a refusal ends the tunnel, a
// request asks to close, or a handler takes the connection over (an upgrade).
func (s *tunnelServer) serve() {
	for n := 0; ; n++ {
		wait := s.idleT
		if n == 0 {
			wait = s.headT
		}
		if wait > 0 {
			_ = s.conn.SetReadDeadline(time.Now().Add(wait))
		}
		if _, err := s.br.Peek(1); err != nil {
			return // closed, or idle past the idle timeout: nothing was asked
		}
		if s.headT > 0 {
			_ = s.conn.SetReadDeadline(time.Now().Add(s.headT))
		}
		s.lim.n = int64(s.maxHead)
		req, err := http.ReadRequest(s.br)
		tooLarge := s.lim.n <= 0
		s.lim.n = 1<<63 - 1
		if err == nil {
			err = checkHead(req)
		}
		if err != nil {
			s.refuseHead(err, tooLarge)
			return
		}
		_ = s.conn.SetReadDeadline(time.Time{})
		if !s.serveOne(req) {
			return
		}
	}
}

// refuseHead answers a head that could not be served, and audits it unless the guard did (a
// head the header timeout cut, or one past net/http's read limit, is the guard's to audit).
func (s *tunnelServer) refuseHead(err error, tooLarge bool) {
	var ne net.Error
	var rf *call.Refusal
	switch {
	case tooLarge:
		rf = &call.Refusal{Code: call.CodeHeaderTooLarge, Reason: "request head exceeds " + strconv.Itoa(s.p.cfg.Limits.MaxHeaderBytes) + " bytes", Close: true}
	case errors.As(err, &ne) && ne.Timeout():
		return
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed):
		if s.g.claim(true) {
			s.g.onHard(&call.Refusal{Code: call.CodeMalformedRequest, Reason: "request head cut short: the client closed the tunnel"})
		}
		return
	default:
		rf = &call.Refusal{Code: call.CodeMalformedRequest, Reason: "malformed request head: " + truncateString(err.Error(), 120), Close: true}
	}
	if s.g.claim(false) {
		s.g.onHard(rf)
	}
	bw := getBufioWriter(s.conn)
	_ = s.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = refusalResponse(nil, rf).Write(bw)
	err = bw.Flush()
	putBufioWriter(bw)
	if err == nil {
		s.linger()
	}
}

// linger reads what the client still sends, for half a second at most, before the tunnel
// closes: closing with unread input resets the connection, and the client could lose the
// answer it was sent (net/http's server waits as long for the same reason).
func (s *tunnelServer) linger() {
	_ = s.conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.CopyN(io.Discard, s.br, 1<<20)
}

// checkHead refuses what net/http's server refuses after http.ReadRequest parsed a head.
func checkHead(r *http.Request) error {
	if r.ProtoMajor != 1 {
		return fmt.Errorf("unsupported protocol version %q", r.Proto)
	}
	// http.ReadRequest moved the Host header to r.Host (an absolute URI's host wins, as in
	// net/http's server).
	switch {
	case r.ProtoAtLeast(1, 1) && r.Host == "":
		return errors.New("missing required Host header")
	case r.Host != "" && !httpguts.ValidHostHeader(r.Host):
		return errors.New("malformed Host header")
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return errors.New("invalid header name")
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return errors.New("invalid header value")
			}
		}
	}
	if e := r.Header.Get("Expect"); e != "" && !(strings.EqualFold(e, "100-continue") && r.ProtoAtLeast(1, 1)) {
		return fmt.Errorf("unsupported Expect %q", truncateString(e, 40))
	}
	return nil
}

// serveOne runs the handler for one request and reports whether the tunnel stays open.
func (s *tunnelServer) serveOne(req *http.Request) (keep bool) {
	req.RemoteAddr = s.remote
	req = req.WithContext(tunnelContext)
	body := &tunnelBody{r: req.Body, continued: true}
	if req.Body != nil && req.Body != http.NoBody {
		body.continued = !strings.EqualFold(req.Header.Get("Expect"), "100-continue")
		body.s = s
		req.Body = body
	}
	w := &tunnelResponse{s: s, req: req, body: body, header: make(http.Header), cl: -1}
	defer func() {
		if v := recover(); v != nil {
			// http.ErrAbortHandler (an upstream response cut short) or a handler's bug: what
			// was written goes out and the connection closes without a clean end.
			if w.bw != nil {
				_ = w.bw.Flush()
				putBufioWriter(w.bw)
			}
			keep = false
		}
	}()
	s.h(w, req)
	if w.hijacked {
		return false
	}
	w.finish()
	return !w.close && !req.Close && body.drain()
}

// tunnelContext is every tunnel request's context. httputil.ReverseProxy aborts a response
// the upstream cut short (panics http.ErrAbortHandler, so the sandbox sees the cut) only when
// the context says a server runs it; serveOne recovers that as net/http's server does.
var tunnelContext = context.WithValue(context.Background(), http.ServerContextKey, &http.Server{})

// limitReader stops a head's read at n bytes.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// tunnelBody is a request's body: it sends 100 Continue before the first read when the client
// waits for it, keeps Close from reading an unbounded rest (the transport closes request
// bodies; net/http's own Close would read to the end), and reads at most maxDrain of what the
// handler left when the request is over.
type tunnelBody struct {
	s         *tunnelServer
	r         io.ReadCloser
	mu        sync.Mutex // the upstream transport may still read while the handler returns
	continued bool
	eof       bool
	closed    bool
}

func (b *tunnelBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.readLocked(p)
}

func (b *tunnelBody) readLocked(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if !b.continued {
		b.continued = true
		bw := getBufioWriter(b.s.conn)
		_, _ = bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		err := bw.Flush()
		putBufioWriter(bw)
		if err != nil {
			return 0, err
		}
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// continueSent reports a 100 Continue this body sent (or a request that expected none).
func (b *tunnelBody) continueSent() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.continued
}

func (b *tunnelBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// drain reads what the handler left of the body, up to maxDrain, and reports whether the
// body ended (so the next request's head follows). A client still waiting for 100 Continue
// sent no body: the connection closes.
func (b *tunnelBody) drain() bool {
	if b.r == nil || b.s == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.eof {
		return true
	}
	if !b.continued {
		return false
	}
	_ = b.s.conn.SetReadDeadline(time.Now().Add(max(b.s.headT, time.Second)))
	defer b.s.conn.SetReadDeadline(time.Time{})
	buf := copyBuffers.Get()
	defer copyBuffers.Put(buf)
	for left := maxDrain; left >= 0; {
		n, err := b.readLocked(buf[:min(len(buf), left+1)])
		left -= n
		if err != nil {
			return b.eof
		}
	}
	return false
}

var bufioWriters sync.Pool

// getBufioWriter is a 4 KiB writer to w from a pool: a tunnel holds one only while it writes a
// response, so an idle tunnel holds none.
func getBufioWriter(w io.Writer) *bufio.Writer {
	if bw, ok := bufioWriters.Get().(*bufio.Writer); ok {
		bw.Reset(w)
		return bw
	}
	return bufio.NewWriterSize(w, 4096)
}

func putBufioWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	bufioWriters.Put(bw)
}
