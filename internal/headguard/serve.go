// Package headguard serves the HTTP/1.1 requests of sandbox connections with net/http's
// server, behind a guard that reads every head as it passes (guard.go): what net/http repairs
// silently (Content-Length beside Transfer-Encoding, obsolete line folding, a head over
// Sandgate's limit) is refused, and every head net/http refuses or drops by itself (malformed,
// far too large, too slow, cut short) is answered by Sandgate's code and audited once.
//
// Sandgate ran its own HTTP/1.1 loop here until issue 38 (internal/httpconn, 1,310 lines) to
// save net/http's background read per request (about 8% of an intercepted request's CPU) and,
// at 10,000 connected sandboxes, the buffers and stack net/http keeps per idle connection. An
// interleaved A/B showed less than the 10% a hand-written replacement on the trust boundary has
// to earn (docs/architecture.md, "Hand-written code on the boundary"): net/http's server, and
// its fixes, serve sandboxes again.
package headguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/call"
)

// Server serves sandbox connections: every connection to a listener (Serve), or one connection
// it is handed (ServeConn: an intercepted tunnel once its TLS is up).
type Server struct {
	// Handler answers every request whose head passed.
	Handler http.Handler
	// Flagged answers, in place of Handler, a request whose head the guard refused (both
	// Content-Length and Transfer-Encoding, obsolete line folding, a head past MaxHeaderBytes
	// that net/http still read whole). It writes the refusal and its audit event.
	Flagged func(w http.ResponseWriter, r *http.Request, rf *call.Refusal)
	// Reject audits a head refused before any request exists: malformed, cut short by the
	// client, past the header timeout, or far past MaxHeaderBytes.
	Reject func(c net.Conn, rf *call.Refusal)
	// Refusal is the answer written for a head refused before any request exists.
	Refusal func(rf *call.Refusal) *http.Response
	// MaxHeaderBytes bounds a request head: over it, 431.
	MaxHeaderBytes int
	// HeaderTimeout bounds the wait for a head once the connection opened or a head began.
	HeaderTimeout time.Duration
	// IdleTimeout closes a connection with no request this long after the last one.
	IdleTimeout time.Duration
}

// ErrGraceOver says Serve closed connections whose requests had not finished within grace.
var ErrGraceOver = errors.New("shutdown grace over")

type guardKey struct{}

// httpServer is the net/http server for conns wrapped in guards; state, when set, sees each
// connection's state changes.
func (s *Server) httpServer(state func(net.Conn, http.ConnState)) *http.Server {
	return &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: s.HeaderTimeout,
		IdleTimeout:       s.IdleTimeout,
		// net/http stops reading at twice the limit (plus 4 KiB): heads between the two are
		// read whole and refused by Flagged, larger ones by net/http with a 431 that the guard
		// turns into Sandgate's.
		MaxHeaderBytes: 2 * s.MaxHeaderBytes,
		// "OPTIONS *" reaches the handler (and its audit event) instead of net/http's own 200.
		DisableGeneralOptionsHandler: true,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, guardKey{}, c)
		},
		ConnState: state,
		ErrorLog:  log.New(io.Discard, "", 0), // every refusal is an audit event already
	}
}

// serveHTTP runs Handler, or Flagged for a head the guard refused.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	g, ok := r.Context().Value(guardKey{}).(*guard)
	if !ok {
		s.Handler.ServeHTTP(w, r) // not reached: every connection is guarded
		return
	}
	defer g.done()
	if rf, bad := g.next(); bad {
		s.Flagged(w, r, rf)
		return
	}
	s.Handler.ServeHTTP(w, r)
}

// wrap guards c: what the guard refuses before a request exists is audited through Reject and
// answered with Refusal.
func (s *Server) wrap(c net.Conn) *guard {
	var g *guard
	g = newGuard(c, s.MaxHeaderBytes, func(rf *call.Refusal) {
		if s.Reject != nil {
			s.Reject(g, rf)
		}
	})
	g.answer = func(rf *call.Refusal) (io.Reader, bool) {
		if s.Refusal == nil {
			return nil, false
		}
		var b bytes.Buffer
		if err := s.Refusal(rf).Write(&b); err != nil {
			return nil, false
		}
		return &b, true
	}
	return g
}

// Serve serves every connection ln accepts until ctx ends or ln fails, then shuts down as
// net/http's server does: it stops accepting, closes the connections waiting for a request, lets
// those serving one finish it for up to grace, then closes the rest. A connection a handler took
// over (a CONNECT tunnel) is its new owner's to end.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	srv := s.httpServer(nil)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(&guardListener{Listener: ln, s: s}) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-errc
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("%w: connections still serving a request after %s were closed", ErrGraceOver, grace)
	}
	return nil
}

// ServeConn serves c's requests on a goroutine of net/http's and returns at once; closed is
// called once when c is over: closed, or taken over by a handler (a CONNECT, an upgrade), whose
// end is then the handler's.
func (s *Server) ServeConn(c net.Conn, closed func()) {
	g := s.wrap(c)
	var once sync.Once
	srv := s.httpServer(func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed || st == http.StateHijacked {
			once.Do(closed)
		}
	})
	// Serve starts the connection's goroutine and returns when the listener runs dry.
	_ = srv.Serve(&oneConnListener{c: g})
}

// guardListener guards every connection it accepts.
type guardListener struct {
	net.Listener
	s *Server
}

func (l *guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.s.wrap(c), nil
}

// oneConnListener hands out one connection, then reports itself closed.
type oneConnListener struct {
	c net.Conn
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if l.c == nil {
		return nil, net.ErrClosed
	}
	c := l.c
	l.c = nil
	return c, nil
}

func (l *oneConnListener) Close() error { return nil }

func (l *oneConnListener) Addr() net.Addr { return addr{} }

type addr struct{}

func (addr) Network() string { return "tcp" }
func (addr) String() string  { return "intercepted-tunnel" }
