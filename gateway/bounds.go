package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"golang.org/x/time/rate"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/mediatype"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/sse"
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
	if s, ok := tr.(*boundedStdio); ok && cause == nil {
		cause = s.failure()
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

// boundedStdio is mcp-go's stdio transport on pipes Sandgate made, so that the server's output
// is read through stdioLines: mcp-go's own command transport reads lines of any length, and
// hands a notification over decoded (its parameters' key order lost), with nothing that says
// which call it came with. The process is started, and stopped, here as mcp-go would.
type boundedStdio struct {
	*transport.Stdio
	cmd   func(ctx context.Context) (*exec.Cmd, error)
	proc  *exec.Cmd
	out   *stdioLines
	outR  *os.File // Sandgate's end of the server's stdout
	outW  *os.File // the server's end
	inR   *os.File
	inW   *os.File
	start atomic.Bool
}

func newBoundedStdio(cmd func(ctx context.Context) (*exec.Cmd, error), maxLine int64) (*boundedStdio, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdio pipe: %w", err)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("stdio pipe: %w", err)
	}
	s := &boundedStdio{cmd: cmd, out: newStdioLines(outR, maxLine), outR: outR, outW: outW, inR: inR, inW: inW}
	s.Stdio = transport.NewIO(s.out, inW, nil)
	return s, nil
}

// Start starts the server, then mcp-go's reading of it.
func (s *boundedStdio) Start(ctx context.Context) error {
	if s.start.Swap(true) {
		return nil
	}
	cmd, err := s.cmd(ctx)
	if err != nil {
		return err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.inR, s.outW, io.Discard
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("failed to start command: %w", err)
	}
	s.proc = cmd
	s.inR.Close() // the server holds its ends now
	s.outW.Close()
	return s.Stdio.Start(ctx)
}

// stdioGrace is how long a server may take to exit once its stdin is closed, and then once
// it got SIGTERM, before it is killed (mcp-go's own timings).
const stdioGrace = 2 * time.Second

// Close closes the server's stdin and waits for it to exit, terminating it if it does not.
func (s *boundedStdio) Close() error {
	err := s.Stdio.Close()
	if s.proc != nil {
		done := make(chan struct{})
		go func() { _ = s.proc.Wait(); close(done) }()
		exited := func() bool {
			select {
			case <-done:
				return true
			case <-time.After(stdioGrace):
				return false
			}
		}
		if !exited() {
			_ = s.proc.Process.Signal(syscall.SIGTERM)
			if !exited() {
				_ = s.proc.Process.Kill()
				<-done
			}
		}
	}
	s.outR.Close()
	return err
}

func (s *boundedStdio) failure() error { return s.out.failure() }

// route hands the server's notifications to h, each with the call it belongs to.
func (s *boundedStdio) route(cli *client.Client, h connHooks) {
	f := func(raw []byte) {
		if in, ok := parseInbound(raw); ok {
			in.call = h.attribute(cli)
			h.notify(in)
		}
	}
	s.out.notify.Store(&f)
}

// answer answers the server's requests to the client with h, from the request as the server
// wrote it.
func (s *boundedStdio) answer(cli *client.Client, h connHooks) {
	s.Stdio.SetRequestHandler(func(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
		raw, ok := s.out.request(req.ID)
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

// stdioLines passes a stdio server's output to mcp-go line by line, and fails at a line over
// max bytes. A notification is taken out and handed to notify, in the order of the output: one
// the server wrote before a response is handled before mcp-go reads that response. A request
// to the client is passed on (mcp-go answers it with the handler the gateway set) and kept as
// written (request) for that handler.
type stdioLines struct {
	r    io.Reader
	max  int64
	buf  []byte
	line []byte // the line read so far
	out  []byte // lines mcp-go has yet to read
	rerr error  // the read error after out

	notify atomic.Pointer[func(raw []byte)]

	mu       sync.Mutex
	requests map[string][]byte // requests to the client as written, by their ID's JSON

	err atomic.Pointer[error]
}

func newStdioLines(r io.Reader, max int64) *stdioLines {
	return &stdioLines{r: r, max: max, buf: make([]byte, 32<<10), requests: map[string][]byte{}}
}

func (l *stdioLines) Read(p []byte) (int, error) {
	for len(l.out) == 0 {
		if e := l.err.Load(); e != nil {
			return 0, *e
		}
		if l.rerr != nil {
			return 0, l.rerr
		}
		n, err := l.r.Read(l.buf)
		if ferr := l.feed(l.buf[:n]); ferr != nil {
			l.err.Store(&ferr)
			return 0, ferr
		}
		l.rerr = err
	}
	n := copy(p, l.out)
	l.out = l.out[:copy(l.out, l.out[n:])]
	return n, nil
}

// feed splits b into lines and handles each complete one.
func (l *stdioLines) feed(b []byte) error {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i]
		}
		if int64(len(l.line)+len(chunk)) > l.max {
			return fmt.Errorf("%w: a stdio message over %d bytes", respguard.ErrTooLarge, l.max)
		}
		l.line = append(l.line, chunk...)
		if i < 0 {
			return nil
		}
		l.handle(bytes.TrimRight(l.line, "\r"))
		l.line = l.line[:0]
		b = b[i+1:]
	}
	return nil
}

// handle takes a notification out of the stream and keeps a request as written.
func (l *stdioLines) handle(line []byte) {
	if m, err := decodeMessage(line); err == nil && m.Method != "" {
		if m.ID.IsNil() {
			if h := l.notify.Load(); h != nil {
				(*h)(bytes.Clone(line))
			}
			return
		}
		if id, err := json.Marshal(m.ID); err == nil {
			l.mu.Lock()
			l.requests[string(id)] = bytes.Clone(line)
			l.mu.Unlock()
		}
	}
	l.out = append(append(l.out, line...), '\n')
}

// request is the request to the client with ID id as the server wrote it, once.
func (l *stdioLines) request(id mcp.RequestId) ([]byte, bool) {
	key, err := json.Marshal(id)
	if err != nil {
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	raw, ok := l.requests[string(key)]
	delete(l.requests, string(key))
	return raw, ok
}

func (l *stdioLines) failure() error {
	if e := l.err.Load(); e != nil {
		return *e
	}
	return nil
}

// notificationLimiter is one upstream session's budget of notifications: x/time/rate's token
// bucket (kept by the Go team, already in the module graph) rather than one of our own.
func notificationLimiter(cfg config.Upstream) *rate.Limiter {
	cfg.ApplyBounds()
	return rate.NewLimiter(rate.Limit(cfg.MaxNotificationRate), max(1, int(cfg.MaxNotificationRate)))
}
