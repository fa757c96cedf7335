package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/mcpstdio"
	"github.com/sandgate/sandgate/internal/mediatype"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/sse"
	"github.com/sandgate/sandgate/internal/telemetry"
)

// Every read from an upstream is bounded (security invariant 7), whoever reads it (Sandgate's
// own requests or mcp-go's transport):
//   - an HTTP upstream's response head is at most maxUpstreamHeaderBytes (upstream_too_large);
//   - its body loses its content codings (respguard.Decode: a stack of up to
//     respguard.MaxCodings of gzip, deflate, br, zstd) or is refused (upstream_encoding); a
//     JSON body is one message, at most max_message_bytes; an event stream's events are each
//     at most max_message_bytes and, answering a forwarded call, all of them at most
//     max_response_bytes; anything else at most max_response_bytes (upstream_too_large);
//   - a stdio server's lines are each at most max_message_bytes; a longer one ends the
//     connection (the server is restarted) and fails the calls on it (upstream_too_large);
//   - an upstream session's notifications are rate-limited (max_notification_rate): the
//     excess is dropped and counted, never queued.

// boundedTransport is the HTTP transport of one upstream, with its bounds.
type boundedTransport struct {
	next                  http.RoundTripper
	maxResponse, maxEvent int64
}

func newBoundedTransport(next http.RoundTripper, cfg config.Upstream) boundedTransport {
	cfg.ApplyBounds()
	return boundedTransport{next: next, maxResponse: cfg.MaxResponseBytes, maxEvent: cfg.MaxMessageBytes}
}

func (b boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(req)
	rp, _ := req.Context().Value(replyKey{}).(*reply)
	if err != nil {
		if headTooLarge(err) {
			err = fmt.Errorf("%w: response head over %d bytes (%w)", respguard.ErrTooLarge, maxUpstreamHeaderBytes, err)
			rp.refuse(err)
		}
		return nil, err
	}
	if err := respguard.Decode(resp); err != nil {
		resp.Body.Close()
		rp.refuse(err)
		return nil, err
	}
	mt, _ := mediatype.Of(resp.Header.Get("Content-Type"))
	body := resp.Body
	switch mt {
	case "text/event-stream":
		body = &eventBound{ReadCloser: body, events: sse.Parser{Max: int(b.maxEvent), CountOnly: true}}
		if rp != nil { // a forwarded call's response, not a long-lived stream
			body = respguard.Limit(body, b.maxResponse, "response")
		}
	case "application/json":
		body = respguard.Limit(body, b.maxEvent, "message")
	default:
		body = respguard.Limit(body, b.maxResponse, "response")
	}
	resp.Body = &reportedBody{ReadCloser: body, rp: rp}
	return resp, nil
}

// maxUpstreamHeaderBytes bounds an HTTP upstream's response head (the default transport's
// MaxResponseHeaderBytes), as the egress proxy bounds its upstreams'.
const maxUpstreamHeaderBytes = 1 << 20

// headTooLarge reports the transport's refusal of a response head over MaxResponseHeaderBytes.
// net/http has no error value for it: these are its messages over HTTP/1.1 and HTTP/2.
func headTooLarge(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "server response headers exceeded") ||
		strings.Contains(msg, "response header list larger than advertised limit")
}

// eventBound fails an event stream at its first event over the bound.
type eventBound struct {
	io.ReadCloser
	events sse.Parser
}

func (e *eventBound) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if _, perr := e.events.Feed(p[:n], func(sse.Event) bool { return true }); perr != nil {
		return 0, fmt.Errorf("%w: an event over %d bytes", respguard.ErrTooLarge, e.events.Max)
	}
	return n, err
}

// reportedBody notes a bound its body went over on the call's reply, whoever reads it.
type reportedBody struct {
	io.ReadCloser
	rp *reply
}

func (r *reportedBody) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if errors.Is(err, respguard.ErrTooLarge) {
		r.rp.refuse(err)
	}
	return n, err
}

// refuse notes that the upstream's answer was refused for a bound or its coding: the call's
// error, whatever mcp-go made of it.
func (rp *reply) refuse(err error) {
	if rp != nil {
		rp.bound.CompareAndSwap(nil, &err)
	}
}

// refused is the bound or coding error noted for the call, nil if none.
func (rp *reply) refused() error {
	if rp == nil {
		return nil
	}
	if e := rp.bound.Load(); e != nil {
		return *e
	}
	return nil
}

// boundFailure is err, a failed call's error, as the bound it went over when one did: on its
// HTTP reply, or on the stdio connection it was sent on.
func boundFailure(err error, rp *reply, tr transport.Interface) error {
	cause := rp.refused()
	if s, ok := tr.(*mcpstdio.Transport); ok && cause == nil {
		cause = s.Failure()
	}
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%v)", cause, err)
}

// boundCode is the refusal code of a call that failed on a bound or a coding, "" otherwise.
func boundCode(err error) string {
	switch {
	case errors.Is(err, respguard.ErrTooLarge):
		return call.CodeUpstreamTooLarge
	case errors.Is(err, respguard.ErrEncoding):
		return call.CodeUpstreamEncoding
	}
	return ""
}

// routeStdio hands the stdio server's notifications to h, each with the call it belongs to.
func routeStdio(s *mcpstdio.Transport, cli *client.Client, h connHooks) {
	s.OnNotification(func(raw []byte) {
		if in, ok := parseInbound(raw); ok {
			in.call = h.attribute(cli)
			h.notify(in)
		}
	})
}

// answerStdio answers the stdio server's requests to the client with h, from the request as the server
// wrote it.
func answerStdio(s *mcpstdio.Transport, cli *client.Client, h connHooks) {
	s.SetRequestHandler(func(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
		raw, ok := s.Request(req.ID)
		if !ok {
			var err error
			if raw, err = json.Marshal(req); err != nil {
				return nil, err
			}
		}
		in, ok := parseInbound(raw)
		if !ok {
			return nil, fmt.Errorf("request %s: not a JSON-RPC request", req.Method)
		}
		in.call = h.attribute(cli)
		return rpcResponse(req.ID, h.request(ctx, in)), nil
	})
}

// rpcResponse is r as mcp-go's response type.
func rpcResponse(id mcp.RequestId, r clientReply) *transport.JSONRPCResponse {
	resp := &transport.JSONRPCResponse{JSONRPC: mcp.JSONRPC_VERSION, ID: id, Result: r.result}
	if r.err != nil {
		resp.Result = nil
		resp.Error = &mcp.JSONRPCErrorDetails{}
		if err := json.Unmarshal(r.err, resp.Error); err != nil {
			resp.Error.Code, resp.Error.Message = codeInternalError, "malformed error"
		}
	}
	return resp
}

// readStdioMessage reads a stdio server's line for mcpstdio as an HTTP upstream's messages are
// read.
func readStdioMessage(line []byte) (string, mcp.RequestId, error) {
	m, err := decodeMessage(line)
	return m.Method, m.ID, err
}

// notificationLimiter is one upstream session's budget of notifications: x/time/rate's token
// bucket (kept by the Go team, already in the module graph) rather than one of our own.
func notificationLimiter(cfg config.Upstream) *rate.Limiter {
	cfg.ApplyBounds()
	return rate.NewLimiter(rate.Limit(cfg.MaxNotificationRate), max(1, int(cfg.MaxNotificationRate)))
}

// tracingTransport writes the W3C traceparent of the request's span into every request to an
// HTTP upstream, replacing any the request carried.
type tracingTransport struct{ base http.RoundTripper }

func (t tracingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if trace.SpanContextFromContext(r.Context()).IsValid() {
		r = r.Clone(r.Context())
		telemetry.Propagator().Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	}
	return t.base.RoundTrip(r)
}
