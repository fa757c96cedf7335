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
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sandgate/sandgate/internal/call"
)

// connServer serves the HTTP/1.1 requests of one sandbox connection, one after another on one
// goroutine: a connection to the proxy listener, or an intercepted tunnel once its TLS is up.
// It is goproxy's own interception loop (read a head with http.ReadRequest, answer it, repeat)
// with Sandgate's head guard, deadlines and refusals.
//
// It replaces net/http's server. That server ran a background read for every request (a
// goroutine, a read that parks, and a deadline to wake it: about 8% of an intercepted
// request's CPU) to notice a client that goes away mid-request. Here a client that goes away is
// noticed when its response is written: a streamed response stops at its next write, and a
// response still awaited upstream is finished and then dropped, as goproxy does.
//
// What net/http's server checks beyond http.ReadRequest is checked here too (version, Host,
// header names and values, Expect), and every head it refuses is answered with Sandgate's
// refusal and audited once (the guard audits the heads a timeout cut).
type connServer struct {
	p       *Proxy
	g       *headGuard // the connection: reads go through it, so it follows the framing
	br      *bufio.Reader
	lim     limitReader
	h       func(w http.ResponseWriter, r *http.Request)
	ctx     context.Context // every request's context
	remote  string
	maxHead int // bytes http.ReadRequest may read for one head
	headT   time.Duration
	idleT   time.Duration
	set     *connSet // the listener's connections (nil in a tunnel)
}

// maxDrain is how much of a request body the handler left unread is read to keep the
// connection open for the next request (net/http's server reads as much); with more, it closes.
const maxDrain = 256 << 10

// serverContext is the base of every request's context. httputil.ReverseProxy aborts a
// response the upstream cut short (panics http.ErrAbortHandler, so the sandbox sees the cut)
// only when the context says a server runs it; serveOne recovers that as net/http's server does.
var serverContext = context.WithValue(context.Background(), http.ServerContextKey, &http.Server{})

func (p *Proxy) newConnServer(g *headGuard, ctx context.Context, h func(http.ResponseWriter, *http.Request)) *connServer {
	l := p.cfg.Limits
	s := &connServer{p: p, g: g, h: h, ctx: ctx, remote: g.RemoteAddr().String(),
		// as net/http's server with MaxHeaderBytes 2*limit: heads between limit and this are
		// refused by the guard's flag, larger ones when the read stops here.
		maxHead: 2*l.MaxHeaderBytes + 4096,
		headT:   l.ClientHandshakeTimeout.D(), idleT: l.TunnelIdleTimeout.D()}
	s.lim.r, s.lim.n = g, 1<<63-1
	s.br = bufio.NewReaderSize(&s.lim, 4096)
	return s
}

// serve answers requests until the client closes, a timeout or a refusal ends the connection,
// a request asks to close, the listener shuts down, or a handler takes the connection over (a
// CONNECT, an upgrade). It reports whether the handler took it: else the caller closes it.
func (s *connServer) serve() (hijacked bool) {
	for n := 0; ; n++ {
		wait := s.idleT
		if n == 0 {
			wait = s.headT
		}
		if wait > 0 {
			_ = s.g.SetReadDeadline(time.Now().Add(wait))
		}
		if !s.set.idle(s, true) {
			return false
		}
		_, err := s.br.Peek(1)
		if !s.set.idle(s, false) || err != nil {
			return false // closed, shut down, or idle past the idle timeout: nothing was asked
		}
		if s.headT > 0 {
			_ = s.g.SetReadDeadline(time.Now().Add(s.headT))
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
			return false
		}
		_ = s.g.SetReadDeadline(time.Time{})
		keep, hijacked := s.serveOne(req)
		if hijacked || !keep {
			return hijacked
		}
	}
}

// refuseHead answers a head that could not be served, and audits it unless the guard did (a
// head the header timeout cut, or one far past the size limit, is the guard's to audit).
func (s *connServer) refuseHead(err error, tooLarge bool) {
	var ne net.Error
	var rf *call.Refusal
	switch {
	case tooLarge:
		rf = &call.Refusal{Code: call.CodeHeaderTooLarge, Reason: "request head exceeds " + strconv.Itoa(s.p.cfg.Limits.MaxHeaderBytes) + " bytes", Close: true}
	case errors.As(err, &ne) && ne.Timeout():
		return
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET):
		if s.g.claim(true) {
			s.g.onHard(&call.Refusal{Code: call.CodeMalformedRequest, Reason: "request head cut short: the client closed the connection"})
		}
		return
	default:
		rf = &call.Refusal{Code: call.CodeMalformedRequest, Reason: "malformed request head: " + truncateString(err.Error(), 120), Close: true}
	}
	if s.g.claim(false) {
		s.g.onHard(rf)
	}
	bw := getBufioWriter(s.g)
	_ = s.g.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = refusalResponse(nil, rf).Write(bw)
	err = bw.Flush()
	putBufioWriter(bw)
	if err == nil {
		s.linger()
	}
}

// linger reads what the client still sends, for half a second at most, before the connection
// closes: closing with unread input resets the connection, and the client could lose the
// answer it was sent (net/http's server waits as long for the same reason).
func (s *connServer) linger() {
	_ = s.g.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
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

// serveOne runs the handler for one request and reports whether the connection stays open,
// or whether the handler took it over.
func (s *connServer) serveOne(req *http.Request) (keep, hijacked bool) {
	req.RemoteAddr = s.remote
	body := &connBody{r: req.Body, continued: true, eof: req.Body == nil || req.Body == http.NoBody}
	if !body.eof {
		body.continued = !strings.EqualFold(req.Header.Get("Expect"), "100-continue")
		body.s = s
		req.Body = body
	}
	req, watch := s.watchRequest(req, body)
	w := &connResponse{s: s, req: req, body: body, header: make(http.Header), cl: -1}
	defer watch.stop()
	defer func() {
		if v := recover(); v != nil {
			// http.ErrAbortHandler (an upstream response cut short) or a handler's bug: what
			// was written goes out and the connection closes without a clean end.
			if w.bw != nil {
				_ = w.bw.Flush()
				putBufioWriter(w.bw)
			}
			keep, hijacked = false, w.hijacked
		}
	}()
	s.h(w, req)
	if w.hijacked {
		return false, true
	}
	w.finish()
	return !w.close && !req.Close && body.drain(), false
}

// limitReader stops a head's read at n bytes. It returns first the byte a watch read ahead.
type limitReader struct {
	r       io.Reader
	n       int64
	pend    byte
	pending bool
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	if l.pending && len(p) > 0 {
		p[0], l.pending = l.pend, false
		l.n--
		return 1, nil
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// connBody is a request's body: it sends 100 Continue before the first read when the client
// waits for it, keeps Close from reading an unbounded rest (the transport closes request
// bodies; net/http's own Close would read to the end), and reads at most maxDrain of what the
// handler left when the request is over.
type connBody struct {
	s         *connServer
	r         io.ReadCloser
	mu        sync.Mutex // the upstream transport may still read while the handler returns
	continued bool
	eof       bool
	closed    bool
}

func (b *connBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.readLocked(p)
}

func (b *connBody) readLocked(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if !b.continued {
		b.continued = true
		bw := getBufioWriter(b.s.g)
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

// ended reports a body read to its end (or none).
func (b *connBody) ended() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.eof
}

// continueSent reports a 100 Continue this body sent (or a request that expected none).
func (b *connBody) continueSent() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.continued
}

func (b *connBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// drain reads what the handler left of the body, up to maxDrain, and reports whether the
// body ended (so the next request's head follows). A client still waiting for 100 Continue
// sent no body: the connection closes.
func (b *connBody) drain() bool {
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
	_ = b.s.g.SetReadDeadline(time.Now().Add(max(b.s.headT, time.Second)))
	defer b.s.g.SetReadDeadline(time.Time{})
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

// getBufioWriter is a 4 KiB writer to w from a pool: a connection holds one only while it writes a
// response, so an idle one holds none.
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
