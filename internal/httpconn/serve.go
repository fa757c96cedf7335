package httpconn

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

// Server serves the HTTP/1.1 requests of sandbox connections: every connection to a listener
// (Serve), or one connection it is handed (ServeConn: an intercepted tunnel once its TLS is up).
// Each connection's requests are served one after another on the connection's goroutine: it is
// goproxy's own interception loop (read a head with http.ReadRequest, answer it, repeat) with
// Sandgate's head guard, deadlines and refusals.
//
// It replaces net/http's server, which ran a background read for every request (a goroutine, a
// read that parks, and a deadline to wake it: about 8% of an intercepted request's CPU) to
// notice a client that goes away mid-request. Here a request still running after watchAfter is
// watched (watch.go); one answered sooner notices a client gone when its response is written.
//
// What net/http's server checks beyond http.ReadRequest is checked here too (version, Host,
// header names and values, Expect), and nothing answers a sandbox but the Server's owner: every
// head refused is answered with Refusal and audited exactly once, by Reject or Flagged.
//
// A connection holds its 4 KiB read buffer while it serves requests and for idleBuffer after;
// one idle longer gives it back to a pool and waits for its next request with a one-byte read,
// so 10,000 sandboxes that keep a connection open hold no buffers (net/http's server holds 8 KiB
// per connection for its life).
//
// Why a loop of Sandgate's own on the trust boundary (docs/architecture.md, "Hand-written code on
// the boundary"): in two interleaved A/B runs against net/http's server behind the same guard
// (35bed22), net/http cost 1.23x and 1.11x the CPU per request on the route, 1.12x and 1.12x
// on intercept, 1.06x and 1.05x on mcp. FuzzServerFramesAsNetHTTP (netdiff_test.go) holds this
// loop to net/http's framing and answers on the same bytes.
type Server struct {
	// Handler answers every request whose head passed.
	Handler http.Handler
	// Flagged answers, in place of Handler, a request whose head the guard refused (both
	// Content-Length and Transfer-Encoding, obsolete line folding, a head past MaxHeaderBytes
	// that was still read whole). It writes the refusal and its audit event.
	Flagged func(w http.ResponseWriter, r *http.Request, rf *call.Refusal)
	// Reject audits a head refused before any request exists: malformed, cut short by the
	// client, past the header timeout, or far past MaxHeaderBytes. It returns the refusal to
	// answer with: rf, or the one that takes its place (call.Core.Reject: the audit log has no
	// room for the event).
	Reject func(c net.Conn, rf *call.Refusal) *call.Refusal
	// Refusal is the answer written for a head refused before any request exists.
	Refusal func(rf *call.Refusal) *http.Response
	// MaxHeaderBytes bounds a request head: over it, 431.
	MaxHeaderBytes int
	// HeaderTimeout bounds the wait for a head once the connection opened or a head began.
	HeaderTimeout time.Duration
	// IdleTimeout closes a connection with no request this long after the last one.
	IdleTimeout time.Duration
	// Base, if set, is the context every request's context derives from; cancelling it with
	// cause call.ErrShutdown cuts the requests (ServeConn's owner does that at the end of a
	// shutdown drain; Serve cuts its own requests itself).
	Base context.Context

	base context.Context // Base (or the background) with http.ServerContextKey; set by prepare
	cut  context.CancelCauseFunc
	once sync.Once
}

// prepare derives the requests' base context once: Base, or the background, with the value
// httputil.ReverseProxy looks for (serverContext), cancelable for Serve's cut.
func (s *Server) prepare() {
	s.once.Do(func() {
		parent := s.Base
		if parent == nil {
			parent = context.Background()
		}
		s.base, s.cut = context.WithCancelCause(context.WithValue(parent, http.ServerContextKey, serverContext.Value(http.ServerContextKey)))
	})
}

// idleBuffer is how long a connection keeps its read buffer after a request: one busy with
// requests keeps it (no extra read per request), one idle longer gives it back.
var idleBuffer = time.Second

// readerReleased, when set (by tests), is called when a connection gave its read buffer back.
var readerReleased func()

// conn serves the requests of one connection.
type conn struct {
	srv     *Server
	g       *guard // the connection: reads go through it, so it follows the framing
	br      *bufio.Reader
	lim     limitReader
	remote  string
	maxHead int       // bytes http.ReadRequest may read for one head
	set     *connSet  // the listener's connections (nil for ServeConn)
	idleEnd time.Time // when an idle connection's wait ends (run)
}

// maxDrain is how much of a request body the handler left unread is read to keep the
// connection open for the next request (net/http's server reads as much); with more, it closes.
const maxDrain = 256 << 10

// serverContext is the base of every request's context. httputil.ReverseProxy aborts a
// response the upstream cut short (panics http.ErrAbortHandler, so the sandbox sees the cut)
// only when the context says a server runs it; serveOne recovers that as net/http's server does.
// Nothing reads the server's fields.
var serverContext = context.WithValue(context.Background(), http.ServerContextKey, &http.Server{})

func (s *Server) newConn(g *guard) *conn {
	c := &conn{srv: s, g: g, remote: g.RemoteAddr().String(),
		// as net/http's server with MaxHeaderBytes 2*limit: heads between limit and this are
		// refused by the guard's flag, larger ones when the read stops here.
		maxHead: 2*s.MaxHeaderBytes + 4096}
	c.lim.r, c.lim.n = g, 1<<63-1
	return c
}

// guard wraps c in a head guard that audits through s.Reject.
func (s *Server) wrap(c net.Conn) *guard {
	var g *guard
	g = newGuard(c, s.MaxHeaderBytes, func(rf *call.Refusal) *call.Refusal {
		if s.Reject != nil {
			return s.Reject(g, rf)
		}
		return rf
	})
	return g
}

// ServeConn serves c's requests until it ends (see conn.serve) and reports whether a handler
// took c over (a CONNECT, an upgrade); else c is closed.
func (s *Server) ServeConn(c net.Conn) (hijacked bool) {
	s.prepare()
	g := s.wrap(c)
	hijacked = s.newConn(g).serve()
	if !hijacked {
		_ = g.Close()
	}
	return hijacked
}

// serve answers requests until the client closes, a timeout or a refusal ends the connection,
// a request asks to close, the listener shuts down, or a handler takes the connection over (a
// CONNECT, an upgrade). It reports whether the handler took it: else the caller closes it.
func (c *conn) serve() (hijacked bool) {
	hijacked, _ = c.loop(true, false)
	return hijacked
}

// run serves a listener's connection (Serve) and closes it at its end. When the connection goes
// idle, the wait for its next request goes on on a new goroutine and this one ends, so the
// stack its requests grew (mcp-go's calls take it to 8–16 KiB) is freed: an idle connection
// holds a small stack and no buffer.
func (c *conn) run(resumed bool) {
	if resumed && c.readFirstByte(c.idleEnd) != nil {
		c.end(false)
		return
	}
	hijacked, idle := c.loop(!resumed, resumed)
	if idle {
		go c.run(true)
		return
	}
	c.end(hijacked)
}

// end forgets a listener's connection, and closes it unless a handler took it over.
func (c *conn) end(hijacked bool) {
	if !hijacked {
		_ = c.g.Close()
	}
	c.set.remove(c)
}

// loop reads and answers requests; first says the connection is new, ready that the first byte
// of the next request was read already (by run). idle says the connection gave its buffer back
// to wait for its next request on a new goroutine (run): only a listener's connections do.
func (c *conn) loop(first, ready bool) (hijacked, idle bool) {
	defer func() {
		if !hijacked {
			c.releaseReader() // a handler that took the connection over has the reader
		}
	}()
	for n := 0; ; n++ {
		var err error
		if !ready || n > 0 {
			if !c.set.idle(c, true) {
				return false, false
			}
			if err = c.waitRequest(first && n == 0); err == errIdle {
				return false, true
			}
		}
		if !c.set.idle(c, false) || err != nil {
			return false, false // closed, shut down, or idle past the idle timeout: nothing was asked
		}
		if t := c.srv.HeaderTimeout; t > 0 {
			_ = c.g.SetReadDeadline(time.Now().Add(t))
		}
		c.lim.n = int64(c.maxHead)
		req, err := http.ReadRequest(c.br)
		tooLarge := c.lim.n <= 0
		c.lim.n = 1<<63 - 1
		if err == nil {
			err = checkHead(req)
		}
		if err != nil {
			c.refuseHead(err, tooLarge)
			return false, false
		}
		_ = c.g.SetReadDeadline(time.Time{})
		keep, hijacked := c.serveOne(req)
		if hijacked || !keep {
			return hijacked, false
		}
	}
}

// errIdle is waitRequest's word that the connection gave its read buffer back and waits for its
// next request on a new goroutine.
var errIdle = errors.New("idle")

// waitRequest waits for the first byte of the next request: up to the header timeout on a new
// connection, the idle timeout between requests. The read buffer is kept for idleBuffer of
// that wait (the next request of a busy connection is read with no extra read) and given back
// for the rest, which waits with a one-byte read of its own: on a new goroutine for a
// listener's connection (errIdle), on this one otherwise.
func (c *conn) waitRequest(first bool) error {
	if first {
		c.br = getReader(&c.lim)
	} else if c.br != nil && c.br.Buffered() > 0 {
		return nil // pipelined: the next head is here already
	}
	wait := c.srv.IdleTimeout
	if first {
		wait = c.srv.HeaderTimeout
	}
	now := time.Now()
	var end time.Time
	if wait > 0 {
		end = now.Add(wait)
	}
	if c.br != nil {
		keep := end
		if wait <= 0 || wait > idleBuffer {
			keep = now.Add(idleBuffer)
		}
		_ = c.g.SetReadDeadline(keep)
		err := c.peekKeepingStack(keep.UnixNano())
		if err == nil || !isTimeout(err) || !end.IsZero() && !keep.Before(end) {
			return err
		}
		c.releaseReader()
		if c.set != nil {
			c.idleEnd = end
			return errIdle
		}
	}
	return c.readFirstByte(end)
}

// waitPad is the stack a busy connection's goroutine holds in use while it waits for its next
// request (peekKeepingStack).
const waitPad = 8 << 10

// peekKeepingStack waits for the next request's first byte in the read buffer, parked inside a
// waitPad-byte frame. The garbage collector halves the stack of a goroutine that uses less
// than a quarter of it when it looks; parked in a shallow read, a busy connection's goroutine
// lost at every collection the stack its requests grow to (the policy evaluation, mcp-go, TLS
// records: 8–32 KiB) and its next request grew it back, a copy of the stack each time. The
// frame keeps the stack (up to four times waitPad) for as long as the connection keeps its
// buffer (idleBuffer); an idle one still waits on a fresh goroutine with a small stack (run).
// The runtime also starts new goroutines (the HTTP/2 client's writer of each upstream request)
// at the average stack in use it finds, which busy connections now raise.
//
//go:noinline
func (c *conn) peekKeepingStack(salt int64) error {
	var pad [waitPad]byte
	i := int(uint64(salt) % waitPad)
	pad[i] = 1 // the frame is written and read at indexes the compiler cannot know, so it stays
	_, err := c.br.Peek(1)
	if pad[(i*7)%waitPad] > 1 {
		panic("httpconn: never: every byte of the pad is 0 or 1")
	}
	return err
}

// readFirstByte waits until end for the next request's first byte, with no buffer, and then
// takes a read buffer for the request.
func (c *conn) readFirstByte(end time.Time) error {
	_ = c.g.SetReadDeadline(end)
	if !c.lim.pending {
		var b [1]byte
		if _, err := io.ReadFull(c.lim.r, b[:]); err != nil {
			return err
		}
		c.lim.pend, c.lim.pending = b[0], true
	}
	c.br = getReader(&c.lim)
	return nil
}

// refuseHead answers a head that could not be served, and audits it unless the guard did (a
// head the header timeout cut, or one far past the size limit, is the guard's to audit).
func (c *conn) refuseHead(err error, tooLarge bool) {
	var ne net.Error
	var rf *call.Refusal
	switch {
	case tooLarge:
		rf = &call.Refusal{Code: call.CodeHeaderTooLarge, Reason: "request head exceeds " + strconv.Itoa(c.srv.MaxHeaderBytes) + " bytes", Close: true}
	case errors.As(err, &ne) && ne.Timeout():
		return
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET):
		if c.g.claim(true) {
			c.g.onHard(&call.Refusal{Code: call.CodeMalformedRequest, Reason: "request head cut short: the client closed the connection"})
		}
		return
	default:
		rf = &call.Refusal{Code: call.CodeMalformedRequest, Reason: "malformed request head: " + truncate(err.Error(), 120), Close: true}
	}
	if c.g.claim(false) {
		rf = c.g.onHard(rf)
	} else if answer := c.g.hardAnswer(); answer != nil {
		rf = answer // the guard audited this head (far too large): as Reject said to answer it
	}
	bw := getWriter(c.g)
	_ = c.g.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = c.srv.Refusal(rf).Write(bw)
	err = bw.Flush()
	putWriter(bw)
	if err == nil {
		c.linger()
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
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
	// An HTTP/1.0 client's 100-continue is ignored, not refused (RFC 9110, 10.1.1), as net/http
	// does: its body is read without a 100 Continue (serveOne).
	if e := r.Header.Get("Expect"); e != "" && !strings.EqualFold(e, "100-continue") {
		return fmt.Errorf("unsupported Expect %q", truncate(e, 40))
	}
	return nil
}

// serveOne runs the handler for one request and reports whether the connection stays open,
// or whether the handler took it over.
func (c *conn) serveOne(req *http.Request) (keep, hijacked bool) {
	req.RemoteAddr = c.remote
	body := &connBody{r: req.Body, continued: true, eof: req.Body == nil || req.Body == http.NoBody, length: req.ContentLength}
	if !body.eof {
		body.continued = !req.ProtoAtLeast(1, 1) || !strings.EqualFold(req.Header.Get("Expect"), "100-continue")
		body.c = c
		req.Body = body
	}
	w := &response{c: c, body: body, header: make(http.Header), cl: -1}
	req, watch := c.watchRequest(req, body, &w.rel)
	w.req = req
	defer watch.stop()
	defer func() {
		if v := recover(); v != nil {
			// http.ErrAbortHandler (an upstream response cut short) or a handler's bug: what
			// was written goes out and the connection closes without a clean end.
			if w.bw != nil {
				_ = w.bw.Flush()
				putWriter(w.bw)
			}
			keep, hijacked = false, w.hijacked
		}
	}()
	c.handle(w, req)
	if w.hijacked {
		return false, true
	}
	w.finish()
	if !w.close && !req.Close && body.drain() {
		return true, false
	}
	if w.complete() {
		c.lingerBody(body) // an answer given before the body was read reaches its client
	}
	return false, false
}

// handle runs the handler for req, or Flagged when the guard refused its head.
func (c *conn) handle(w http.ResponseWriter, req *http.Request) {
	defer c.g.done()
	if rf, bad := c.g.next(); bad {
		c.srv.Flagged(w, req, rf)
		return
	}
	c.srv.Handler.ServeHTTP(w, req)
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
	c         *conn
	r         io.ReadCloser
	mu        sync.Mutex // the upstream transport may still read while the handler returns
	continued bool
	eof       bool
	closed    bool
	length    int64 // the declared Content-Length, -1 when unknown (chunked)
	n         int64 // bytes read
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
		bw := getWriter(b.c.g)
		_, _ = bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		err := bw.Flush()
		putWriter(bw)
		if err != nil {
			return 0, err
		}
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
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
	if b.r == nil || b.c == nil {
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
	_ = b.c.g.SetReadDeadline(time.Now().Add(max(b.c.srv.HeaderTimeout, time.Second)))
	defer b.c.g.SetReadDeadline(time.Time{})
	bp := drainBuffers.Get().(*[8192]byte)
	defer drainBuffers.Put(bp)
	buf := bp[:]
	for left := maxDrain; left >= 0; {
		n, err := b.readLocked(buf[:min(len(buf), left+1)])
		left -= n
		if err != nil {
			return b.eof
		}
	}
	return false
}

var (
	readers      sync.Pool
	writers      sync.Pool
	drainBuffers = sync.Pool{New: func() any { return new([8192]byte) }}
)

// getReader is a 4 KiB reader of r from a pool: a connection holds one while it serves
// requests (see waitRequest).
func getReader(r io.Reader) *bufio.Reader {
	if br, ok := readers.Get().(*bufio.Reader); ok {
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, 4096)
}

// releaseReader gives the connection's read buffer back, when nothing is left in it.
func (c *conn) releaseReader() {
	if c.br == nil || c.br.Buffered() > 0 {
		return
	}
	c.br.Reset(nil)
	readers.Put(c.br)
	c.br = nil
	if readerReleased != nil {
		readerReleased()
	}
}

// getWriter is a 4 KiB writer to w from a pool: a connection holds one only while it writes a
// response, so an idle one holds none.
func getWriter(w io.Writer) *bufio.Writer {
	if bw, ok := writers.Get().(*bufio.Writer); ok {
		bw.Reset(w)
		return bw
	}
	return bufio.NewWriterSize(w, 4096)
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writers.Put(bw)
}
