package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/sse"
)

// upstreamHTTP is mcp-go's Streamable HTTP client transport with the requests of a 2026-07-28
// connection sent by Sandgate itself. That revision has no session, no resumable streams and
// no server-initiated requests, so a request is one POST whose answer is one JSON message or
// one SSE stream of notifications ending in the response: about a hundred lines, against
// mcp-go's path of a goroutine per request, a request re-encoded (params included), a header
// map cloned and the response decoded twice. Measured on the mcp workload (interleaved A/B,
// CPU per call): see the commit that introduced it. Everything else (initialize and
// server/discover, which set the connection up, subscriptions/listen, notifications, and
// every request of a legacy connection) goes through mcp-go's transport unchanged.
type upstreamHTTP struct {
	*transport.StreamableHTTP
	url     string
	http    *http.Client
	headers func(context.Context) map[string]string
	log     *slog.Logger
	// maxMessage bounds one event of a response stream (max_message_bytes); the transport
	// bounds the bodies it reads too (bounds.go).
	maxMessage int

	version atomic.Pointer[string]
	notify  atomic.Pointer[func(mcp.JSONRPCNotification)]
	handle  atomic.Pointer[transport.RequestHandler]

	// closed ends every request in flight when the connection is closed, as mcp-go does.
	closed    context.Context
	close     context.CancelFunc
	closeOnce sync.Once
}

func newUpstreamHTTP(t *transport.StreamableHTTP, u *upstream) *upstreamHTTP {
	ctx, cancel := context.WithCancel(context.Background())
	return &upstreamHTTP{StreamableHTTP: t, url: u.cfg.URL, http: u.http, headers: u.headers, log: u.log,
		maxMessage: int(u.cfg.MaxMessageBytes), closed: ctx, close: cancel}
}

func (t *upstreamHTTP) SetProtocolVersion(v string) {
	t.version.Store(&v)
	t.StreamableHTTP.SetProtocolVersion(v)
}

func (t *upstreamHTTP) SetNotificationHandler(h func(mcp.JSONRPCNotification)) {
	t.notify.Store(&h)
	t.StreamableHTTP.SetNotificationHandler(h)
}

func (t *upstreamHTTP) SetRequestHandler(h transport.RequestHandler) {
	t.handle.Store(&h)
	t.StreamableHTTP.SetRequestHandler(h)
}

func (t *upstreamHTTP) Close() error {
	t.closeOnce.Do(t.close)
	return t.StreamableHTTP.Close()
}

// modern is the connection's protocol version when it is 2026-07-28 or later.
func (t *upstreamHTTP) modern() (string, bool) {
	v := t.version.Load()
	if v == nil || !mcp.IsModernProtocol(*v) {
		return "", false
	}
	return *v, true
}

// SendRequest sends req itself on a 2026-07-28 connection, except the requests that set the
// connection up (initialize, server/discover) and the listen stream, which mcp-go tracks.
func (t *upstreamHTTP) SendRequest(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	version, ok := t.modern()
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
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
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
		return t.readStream(ctx, version, resp.Body)
	default:
		return nil, fmt.Errorf("unexpected content type: %s", resp.Header.Get("Content-Type"))
	}
}

// post sends one JSON-RPC message with the connection's headers: the request's own (the
// revision's standard headers), the protocol version and the credential.
func (t *upstreamHTTP) post(ctx context.Context, version string, body []byte, h http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("failed to create request: %w", err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Accept"] = []string{"application/json, text/event-stream"}
	req.Header.Set(transport.HeaderKeyProtocolVersion, version)
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

// readStream reads an SSE response: notifications go to the connection's handler in the
// order they came, a request from the server (which this revision does not have) is answered
// by the client's handler, and the first response ends the request.
func (t *upstreamHTTP) readStream(ctx context.Context, version string, body io.Reader) (*transport.JSONRPCResponse, error) {
	var res *transport.JSONRPCResponse
	err := readEvents(body, t.maxMessage, func(data []byte) bool {
		m, err := decodeMessage(data)
		switch {
		case err != nil:
			t.log.Info("upstream sent an SSE event that is not JSON-RPC (skipped)", "err", err, "len", len(data))
		case m.ID.IsNil():
			t.notification(data)
		case m.Method != "":
			go t.answer(context.WithoutCancel(ctx), version, data)
		default:
			res = m.response()
			return false
		}
		return true
	})
	switch {
	case res != nil:
		return res, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		return nil, fmt.Errorf("SSE stream error: %w", err)
	}
	return nil, errors.New("unexpected nil response")
}

func (t *upstreamHTTP) notification(data []byte) {
	var n mcp.JSONRPCNotification
	if err := json.Unmarshal(data, &n); err != nil {
		t.log.Error("failed to unmarshal notification", "err", err)
		return
	}
	if h := t.notify.Load(); h != nil {
		(*h)(n)
	}
}

// answer runs the client's handler on a request the server sent on a response stream and
// posts its answer (an error when there is no handler or it failed).
func (t *upstreamHTTP) answer(ctx context.Context, version string, data []byte) {
	var req transport.JSONRPCRequest
	if err := json.Unmarshal(data, &req); err != nil {
		t.log.Error("failed to unmarshal server request", "err", err)
		return
	}
	var res *transport.JSONRPCResponse
	var err error
	if h := t.handle.Load(); h != nil {
		res, err = (*h)(ctx, req)
	} else {
		err = fmt.Errorf("no handler configured for method: %s", req.Method)
	}
	if err != nil {
		res = transport.NewJSONRPCErrorResponse(req.ID, mcp.INTERNAL_ERROR, err.Error(), nil)
	}
	if res == nil {
		return
	}
	body, err := json.Marshal(res)
	if err != nil {
		return
	}
	resp, err := t.post(ctx, version, body, nil)
	if err != nil {
		t.log.Error("failed to send response to server", "err", err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// readEvents calls handle with the data of each server-sent event of body (internal/sse, each
// event at most max bytes) until handle returns false or body ends; event types, ids and
// retry fields are read past (a 2026-07-28 response stream is not resumed). An event the
// stream ends inside is still handled, as mcp-go's reader does.
func readEvents(body io.Reader, max int, handle func(data []byte) bool) error {
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
		if len(ev.Data) > 0 && !handle(ev.Data) {
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
		raw = wireMessage{Method: m.Method, ID: m.ID, Result: m.Result, Error: m.Error}
	} else if err := json.Unmarshal(data, &raw); err != nil {
		return message{}, err
	}
	m := message{Method: raw.Method, Result: raw.Result, Error: raw.Error}
	if len(raw.ID) == 0 || string(raw.ID) == "null" {
		return m, nil
	}
	if s, ok := plainString(raw.ID); ok {
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
