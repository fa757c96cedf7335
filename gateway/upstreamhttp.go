package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/jsonscan"
	"github.com/sandgate/sandgate/internal/mediatype"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/sse"
)

// upstreamHTTP is mcp-go's Streamable HTTP client transport with every request after the
// handshake sent by Sandgate itself, and the connection's listening stream (the GET of the
// legacy revisions) read by Sandgate too. mcp-go keeps the handshake (initialize,
// server/discover), which sets the connection's session and revision, and the 2026-07-28
// subscriptions/listen stream.
//
// Reading a request's response stream itself is how Sandgate knows which call each message on
// it belongs to (route.go): mcp-go's transport hands a notification to one handler for the
// whole connection, without the request it came with, and decodes a request to the client
// into a map, which loses the order of its keys (an elicitation's form fields). A request is
// one POST whose answer is one JSON message or one SSE stream of notifications and requests
// ending in the response; before 2026-07-28 a stream the server ends before the response, once
// it sent an event ID, is resumed with a GET carrying Last-Event-ID (SEP-1699). It is also
// the shorter path: mcp-go's costs a goroutine per request, the request re-encoded (params
// included), a header map cloned and the response decoded twice.
type upstreamHTTP struct {
	*transport.StreamableHTTP
	url     string
	http    *http.Client
	headers func(context.Context) map[string]string
	log     *slog.Logger
	hooks   connHooks
	// maxMessage bounds one event of a response stream (max_message_bytes); the transport
	// bounds the bodies it reads too (bounds.go).
	maxMessage int

	version atomic.Pointer[string]

	// closed ends every request in flight, and the listening stream, when the connection is
	// closed, as mcp-go does.
	closed    context.Context
	close     context.CancelFunc
	closeOnce sync.Once
}

func newUpstreamHTTP(t *transport.StreamableHTTP, u *upstream, h connHooks) *upstreamHTTP {
	ctx, cancel := context.WithCancel(context.Background())
	return &upstreamHTTP{StreamableHTTP: t, url: u.cfg.URL, http: u.http, headers: u.headers, log: u.log, hooks: h,
		maxMessage: int(u.cfg.MaxMessageBytes), closed: ctx, close: cancel}
}

func (t *upstreamHTTP) SetProtocolVersion(v string) {
	t.version.Store(&v)
	t.StreamableHTTP.SetProtocolVersion(v)
}

func (t *upstreamHTTP) Close() error {
	t.closeOnce.Do(t.close)
	return t.StreamableHTTP.Close()
}

// negotiated is the connection's protocol version, once the handshake set it.
func (t *upstreamHTTP) negotiated() (string, bool) {
	v := t.version.Load()
	if v == nil || *v == "" {
		return "", false
	}
	return *v, true
}

// SendRequest sends req itself, except the requests that set the connection up (initialize,
// server/discover) and the subscriptions/listen stream, which mcp-go tracks.
func (t *upstreamHTTP) SendRequest(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	version, ok := t.negotiated()
	switch mcp.MCPMethod(req.Method) {
	case mcp.MethodInitialize, mcp.MethodServerDiscover, mcp.MethodSubscriptionsListen:
		ok = false
	}
	if !ok {
		return t.StreamableHTTP.SendRequest(ctx, req)
	}
	body, err := encodeRequest(req)
	if err != nil {
		return nil, fmt.Errorf("failed to marshal request: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.closed, cancel)
	defer stop()
	resp, err := t.post(ctx, version, body, req.Header)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return refused(resp)
	}
	mediaType, _ := mediatype.Of(resp.Header.Get("Content-Type"))
	switch mediaType {
	case "application/json":
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("failed to decode response: %w", err)
		}
		m, err := decodeMessage(b)
		if err != nil {
			return nil, fmt.Errorf("failed to decode response: %w", err)
		}
		if m.ID.IsNil() {
			return nil, fmt.Errorf("response should contain RPC id: %s", truncate(string(b), 200))
		}
		return m.response(), nil
	case "text/event-stream":
		return t.readResponseStream(ctx, version, resp.Body)
	default:
		return nil, fmt.Errorf("unexpected content type: %s", resp.Header.Get("Content-Type"))
	}
}

// send sends one HTTP request of the connection with its headers: the request's own (the
// revision's standard headers), the session (before 2026-07-28), the protocol version and the
// credential. A 404 ends the session.
func (t *upstreamHTTP) send(ctx context.Context, method, version string, body []byte, h http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, t.url, rd)
	if err != nil {
		return nil, fmt.Errorf("failed to create request: %w", err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if method == http.MethodPost {
		req.Header["Content-Type"] = []string{"application/json"}
		req.Header["Accept"] = []string{"application/json, text/event-stream"}
	} else {
		req.Header["Accept"] = []string{"text/event-stream"}
	}
	req.Header.Set(transport.HeaderKeyProtocolVersion, version)
	if sid := t.GetSessionId(); sid != "" && !mcp.IsModernProtocol(version) {
		req.Header.Set(transport.HeaderKeySessionID, sid)
	}
	for k, v := range t.headers(ctx) {
		req.Header.Set(k, v)
	}
	resp, err := t.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to send request: %w", err)
	}
	if resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		return nil, transport.ErrSessionTerminated
	}
	return resp, nil
}

// post sends one JSON-RPC message.
func (t *upstreamHTTP) post(ctx context.Context, version string, body []byte, h http.Header) (*http.Response, error) {
	return t.send(ctx, http.MethodPost, version, body, h)
}

// refused is the answer to a request the upstream refused with an HTTP status, as mcp-go
// reports it: the JSON-RPC error of the body if it holds one.
func refused(resp *http.Response) (*transport.JSONRPCResponse, error) {
	if resp.StatusCode == http.StatusUnauthorized {
		return nil, &transport.AuthorizationRequiredError{}
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var r transport.JSONRPCResponse
	if err := json.Unmarshal(body, &r); err == nil {
		return &r, nil
	}
	return nil, fmt.Errorf("request failed with status %d: %s", resp.StatusCode, body)
}

// SSE reconnection times of a stream resumed without the server naming one (mcp-go's), and the
// shortest taken from a server.
const (
	defaultResumeDelay = time.Second
	minResumeDelay     = 10 * time.Millisecond
)

// readResponseStream reads the SSE response to a request: its messages are routed with the
// request's call (route.go) in the order they came, and the first response ends it. Before
// 2026-07-28, a stream the server ends before the response after sending an event ID is
// resumed with Last-Event-ID after the retry time it set.
func (t *upstreamHTTP) readResponseStream(ctx context.Context, version string, body io.Reader) (*transport.JSONRPCResponse, error) {
	var cur cursor
	call := callOf(ctx)
	for {
		res, err := t.readStream(ctx, version, body, call, &cur)
		switch {
		case res != nil:
			return res, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, fmt.Errorf("SSE stream error: %w", err)
		case cur.lastID == "" || mcp.IsModernProtocol(version):
			return nil, errors.New("unexpected nil response")
		}
		delay := defaultResumeDelay
		if cur.retry >= 0 {
			delay = max(time.Duration(cur.retry)*time.Millisecond, minResumeDelay)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		resp, err := t.send(ctx, http.MethodGet, version, nil, http.Header{"Last-Event-Id": {cur.lastID}})
		if err != nil {
			return nil, fmt.Errorf("failed to resume the SSE stream for the response: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("failed to resume the SSE stream for the response: status %d", resp.StatusCode)
		}
		body = resp.Body
	}
}

// cursor is where a stream was read up to: the last event ID and the retry time it set (-1:
// none).
type cursor struct {
	lastID string
	retry  int64
}

// readStream reads one SSE stream: notifications and requests to the client are routed with
// call (nil: the listening stream), a response ends it and is returned. It returns no response
// and no error when the stream ended.
func (t *upstreamHTTP) readStream(ctx context.Context, version string, body io.Reader, call *inflightCall, cur *cursor) (*transport.JSONRPCResponse, error) {
	var res *transport.JSONRPCResponse
	err := readEvents(body, t.maxMessage, func(ev sse.Event) bool {
		if cur != nil {
			cur.lastID, cur.retry = ev.ID, ev.Retry
		}
		if len(ev.Data) == 0 {
			return true
		}
		m, err := decodeMessage(ev.Data)
		switch {
		case err != nil:
			t.log.Info("upstream sent an SSE event that is not JSON-RPC (skipped)", "err", err, "len", len(ev.Data))
		case m.Method != "":
			in, ok := parseInbound(bytes.Clone(ev.Data))
			if !ok {
				return true
			}
			in.call = call
			if m.ID.IsNil() {
				t.hooks.notify(in)
			} else {
				go t.answer(context.WithoutCancel(ctx), version, in)
			}
		default:
			res = m.response()
			return false
		}
		return true
	})
	return res, err
}

// answer asks the client's side (route.go) to answer a request the server sent, and posts the
// answer.
func (t *upstreamHTTP) answer(ctx context.Context, version string, in inbound) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.closed, cancel)
	defer stop()
	r := t.hooks.request(ctx, in)
	resp, err := t.post(ctx, version, responseBytes(in.id, r), nil)
	if err != nil {
		t.log.Info("answer to an upstream's request not sent", "method", in.method, "err", err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// responseBytes is the response with id carrying r.
func responseBytes(id json.RawMessage, r clientReply) []byte {
	b := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
	if r.err != nil {
		b = append(append(b, `,"error":`...), r.err...)
	} else {
		b = append(append(b, `,"result":`...), r.result...)
	}
	return append(b, '}')
}

// listen opens the connection's listening stream (the GET of the legacy revisions), where the
// server sends what is not part of a request (list changes, resource updates, log messages,
// its own requests), and reads it until the connection is closed: a stream that ends or fails
// is opened again with the last event ID it carried (Last-Event-ID), after a backoff that
// grows while it keeps failing. It returns once the server answered the first GET (or ctx
// ended), so that nothing the server sends right after the handshake is lost; a server
// without one (405) or that ended the session (404) is not asked again.
func (t *upstreamHTTP) listen(ctx context.Context, version string) {
	first := make(chan struct{})
	go t.listenLoop(version, first)
	select {
	case <-first:
	case <-ctx.Done():
	}
}

func (t *upstreamHTTP) listenLoop(version string, first chan struct{}) {
	answered := sync.OnceFunc(func() { close(first) })
	defer answered()
	backoff := backoffMin
	var cur cursor
	for t.closed.Err() == nil {
		var h http.Header
		if cur.lastID != "" {
			h = http.Header{"Last-Event-Id": {cur.lastID}}
		}
		resp, err := t.send(t.closed, http.MethodGet, version, nil, h)
		answered()
		mt := ""
		if err == nil {
			mt, _ = mediatype.Of(resp.Header.Get("Content-Type"))
		}
		switch {
		case errors.Is(err, transport.ErrSessionTerminated):
			return
		case err == nil && resp.StatusCode == http.StatusMethodNotAllowed:
			resp.Body.Close()
			t.log.Debug("upstream offers no listening stream (405)")
			return
		case err == nil && resp.StatusCode == http.StatusOK && mt == "text/event-stream":
			backoff = backoffMin
			_, err = t.readStream(t.closed, version, resp.Body, nil, &cur)
			resp.Body.Close()
		case err == nil:
			resp.Body.Close()
			err = fmt.Errorf("status %d, content type %q", resp.StatusCode, mt)
		}
		if t.closed.Err() != nil {
			return
		}
		wait := jittered(backoff)
		t.log.Debug("upstream listening stream ended; opening it again", "err", err, "retry_in", wait)
		select {
		case <-t.closed.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(backoff*2, backoffMax)
	}
}

// readEvents calls handle with each server-sent event of body (internal/sse, each event at
// most max bytes) until handle returns false or body ends. An event the stream ends inside is
// still handled, as mcp-go's reader does.
func readEvents(body io.Reader, max int, handle func(ev sse.Event) bool) error {
	rd := sse.NewReader(body, max)
	rd.Lenient = true
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if errors.Is(err, sse.ErrTooLarge) {
				return fmt.Errorf("%w: an event over %d bytes", respguard.ErrTooLarge, max)
			}
			return err
		}
		if !handle(ev) {
			return nil
		}
	}
}

// message is a JSON-RPC message read from an upstream: enough to tell a response from a
// notification or a request, and the response's parts as the upstream wrote them.
type message struct {
	Method string
	ID     mcp.RequestId
	Result json.RawMessage
	Error  json.RawMessage
}

// wireMessage is what decodeMessage reads of a message encoding/json has to read.
type wireMessage struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// decodeMessage reads data as json.Unmarshal into transport.JSONRPCResponse would, in one
// scan where it can (scanMessage).
func decodeMessage(data []byte) (message, error) {
	var raw wireMessage
	if m, ok := scanMessage(data); ok {
		raw = wireMessage(m)
	} else if err := json.Unmarshal(data, &raw); err != nil {
		return message{}, err
	}
	m := message{Method: raw.Method, Result: raw.Result, Error: raw.Error}
	if len(raw.ID) == 0 || string(raw.ID) == "null" {
		return m, nil
	}
	if s, ok := jsonscan.PlainString(raw.ID); ok {
		m.ID = mcp.NewRequestId(s)
		return m, nil
	}
	if err := json.Unmarshal(raw.ID, &m.ID); err != nil {
		return message{}, err
	}
	return m, nil
}

// response is m as mcp-go's response type; an error that is not a JSON-RPC error object is
// kept as its text.
func (m message) response() *transport.JSONRPCResponse {
	r := &transport.JSONRPCResponse{JSONRPC: mcp.JSONRPC_VERSION, ID: m.ID, Result: m.Result}
	if len(m.Error) > 0 && string(m.Error) != "null" {
		r.Error = &mcp.JSONRPCErrorDetails{}
		if err := json.Unmarshal(m.Error, r.Error); err != nil {
			r.Error.Code, r.Error.Message = mcp.INTERNAL_ERROR, "malformed error from upstream: "+truncate(string(m.Error), 200)
		}
	}
	return r
}

// encodeRequest writes req as json.Marshal would, except that params Sandgate already
// encoded (a json.RawMessage) are copied, not re-read, and no HTML characters are escaped.
func encodeRequest(req transport.JSONRPCRequest) ([]byte, error) {
	var params []byte
	switch p := req.Params.(type) {
	case json.RawMessage:
		params = p
	case nil:
	default:
		var err error
		if params, err = json.Marshal(p); err != nil {
			return nil, err
		}
	}
	b := make([]byte, 0, len(params)+len(req.Method)+64)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	switch id := req.ID.Value().(type) {
	case string:
		b = jsonenc.AppendString(b, id)
	case int64:
		b = strconv.AppendInt(b, id, 10)
	default:
		idb, err := json.Marshal(req.ID)
		if err != nil {
			return nil, err
		}
		b = append(b, idb...)
	}
	b = append(b, `,"method":`...)
	b = jsonenc.AppendString(b, req.Method)
	if len(params) > 0 {
		b = append(b, `,"params":`...)
		b = append(b, params...)
	}
	return append(b, '}'), nil
}
