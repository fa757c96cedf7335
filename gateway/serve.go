package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/httpconn"
	"github.com/sandgate/sandgate/internal/identity"
)

// Limits of the MCP listener's connections (net/http's server had the same ones here).
const (
	maxHeaderBytes = 64 << 10
	headerTimeout  = 10 * time.Second
	idleTimeout    = 2 * time.Minute
)

// Serve serves the sandboxes' MCP on ln (/mcp) until ctx ends, then stops accepting and lets
// the requests in flight finish for up to grace. Connections are served by internal/httpconn,
// the proxy's own loop: a head it refuses (malformed, smuggling-prone, too large, cut short,
// too slow) is answered with a JSON-RPC error and audited once as mcp.rejected, like every
// other refusal of this listener; a path other than /mcp is refused the same way (404
// not_found). An idle connection holds no read or write buffer.
//
// A sandbox's standalone GET stream is no call waiting for its answer: it ends as soon as the
// listener stops accepting (the sandbox reconnects, to another replica if there is one), so that
// only calls hold the drain. A call still running after grace is cut, with its event.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	stop := context.AfterFunc(ctx, g.endStreams)
	defer stop()
	srv := &httpconn.Server{Handler: http.HandlerFunc(g.serveListener), Flagged: g.flagged, Reject: g.rejectConn,
		Refusal: rpcRefusal, MaxHeaderBytes: maxHeaderBytes, HeaderTimeout: headerTimeout, IdleTimeout: idleTimeout}
	err := srv.Serve(ctx, ln, grace)
	switch {
	case ctx.Err() == nil:
		return fmt.Errorf("serve mcp: %w", err)
	case errors.Is(err, httpconn.ErrGraceOver):
		g.log.Info("mcp listener stopped", "closed", err.Error())
	}
	return nil
}

// serveListener serves /mcp and refuses every other path.
func (g *Gateway) serveListener(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/mcp" {
		g.flagged(w, r, call.Refuse(call.CodeNotFound, "no MCP endpoint at %q; the endpoint is /mcp", truncate(r.URL.Path, 100)))
		return
	}
	g.handler.ServeHTTP(w, r)
}

// flagged refuses a request before the guard reads it: one mcp.rejected event.
func (g *Gateway) flagged(w http.ResponseWriter, r *http.Request, rf *call.Refusal) {
	id := identity.FromRemoteAddr(g.opts.Identity, r.RemoteAddr)
	answered := g.core.Reject(r.Context(), audit.KindMCPRejected, id, audit.Target{Method: r.Method}, rf)
	if answered.Close {
		w.Header().Set("Connection", "close")
	}
	writeRPCError(w, answered.Status(), nil, codeInvalidRequest, answered)
}

// rejectConn audits a head refused before any request exists, and returns the refusal to answer.
func (g *Gateway) rejectConn(c net.Conn, rf *call.Refusal) *call.Refusal {
	return g.core.Reject(context.Background(), audit.KindMCPRejected, identity.FromRemoteAddr(g.opts.Identity, c.RemoteAddr().String()), audit.Target{}, rf)
}

// rpcRefusal is the answer to a head refused before any request exists.
func rpcRefusal(rf *call.Refusal) *http.Response {
	b := rpcErrorBody(nil, rpcError{Code: rpcCode(codeInvalidRequest, rf), Message: rf.Reason, Data: refusalData{Code: rf.Code}})
	status := rf.Status()
	return &http.Response{StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		ProtoMajor: 1, ProtoMinor: 1, Close: true, ContentLength: int64(len(b)),
		Header: http.Header{"Content-Type": {"application/json"}, "X-Content-Type-Options": {"nosniff"}},
		Body:   io.NopCloser(bytes.NewReader(b))}
}
