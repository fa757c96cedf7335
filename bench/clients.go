package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// Workloads: what one request of a sandbox is.
const (
	WMCP   = "mcp"   // tools/call through the gateway, on the sandbox's MCP session
	WRoute = "route" // model-API request to the base-URL route (plain HTTP to the proxy)
	// WRouteConv is the route with the body an agent sends: the conversation so far, 64 KiB.
	WRouteConv = "route-conv"
	WIntercept = "intercept"  // model-API request through CONNECT with TLS interception
	WTunnel    = "tunnel"     // HTTPS request inside a kept-alive CONNECT tunnel
	WTunnelNew = "tunnel-new" // one CONNECT tunnel (and TLS handshake) per request
	WForward   = "forward"    // plain-HTTP absolute-URI request through the proxy
	// WMix is what an agent does: each sandbox keeps an MCP session and a connection of every
	// kind and rotates tools/call, routed, intercepted and tunneled requests.
	WMix = "mix"
)

// mixParts are the workloads a mix sandbox rotates over, in order.
var mixParts = []string{WMCP, WRoute, WIntercept, WTunnel}

// requester sends one request of a workload as one sandbox.
type requester interface {
	// Do sends request number seq and returns an error unless the answer is complete and OK.
	Do(ctx context.Context, seq int) error
	// Close ends the sandbox's MCP session, if it has one, and releases idle connections.
	Close()
}

// clientEnv is what every sandbox client needs to know about the run.
type clientEnv struct {
	up      *Upstreams
	roots   *x509.CertPool // stand-in CA (+ Sandgate's interception CA)
	timeout time.Duration
}

// newRequester builds sandbox sb's client for workload w through target t.
func newRequester(env *clientEnv, t *Target, w string, sb int) (requester, error) {
	if w == WMix {
		m := &mixClient{}
		for _, part := range mixParts {
			r, err := newRequester(env, t, part, sb)
			if err != nil {
				return nil, err
			}
			m.parts = append(m.parts, r)
		}
		return m, nil
	}
	src := &net.TCPAddr{IP: sandboxAddr(sb).AsSlice()}
	d := &net.Dialer{LocalAddr: src, Timeout: 5 * time.Second, KeepAlive: -1}
	tlsPort := env.up.TLSAddr[strings.LastIndexByte(env.up.TLSAddr, ':')+1:]
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if h, p, _ := net.SplitHostPort(addr); h == modelHost {
				addr = net.JoinHostPort(upstreamIP, p) // the loadgen's own "DNS" for direct runs
			}
			return d.DialContext(ctx, network, addr)
		},
		TLSClientConfig:     &tls.Config{RootCAs: env.roots, ClientSessionCache: nil},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	if t.Proxy != "" && w != WRoute && w != WRouteConv && w != WMCP {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: t.Proxy})
	}
	if w == WTunnelNew {
		tr.DisableKeepAlives = true
	}
	hc := &http.Client{Transport: tr, Timeout: env.timeout}
	model := "https://" + modelHost + ":" + tlsPort
	switch w {
	case WMCP:
		return &mcpClient{hc: hc, tr: tr, url: t.MCPURL}, nil
	case WRoute, WRouteConv:
		base := t.RouteURL
		if base == "" {
			base = model
		}
		c := &httpClient{hc: hc, tr: tr, url: base + "/v1/messages", model: true}
		if w == WRouteConv {
			c.conversation = conversation
		}
		return c, nil
	case WIntercept:
		return &httpClient{hc: hc, tr: tr, url: model + "/v1/messages", model: true}, nil
	case WTunnel, WTunnelNew:
		return &httpClient{hc: hc, tr: tr, url: "https://" + env.up.TLSAddr + "/v1/models"}, nil
	case WForward:
		return &httpClient{hc: hc, tr: tr, url: "http://" + env.up.HTTPAddr + "/v1/models"}, nil
	}
	return nil, fmt.Errorf("unknown workload %q", w)
}

// mixClient rotates one sandbox's requests over its clients of every kind.
type mixClient struct{ parts []requester }

func (m *mixClient) Do(ctx context.Context, seq int) error {
	n := len(m.parts)
	return m.parts[seq%n].Do(ctx, seq/n)
}

// Warm connects every part (the runner's warm-up calls it instead of one Do).
func (m *mixClient) Warm(ctx context.Context) error {
	for i, p := range m.parts {
		if err := p.Do(ctx, i); err != nil {
			return fmt.Errorf("%s: %w", mixParts[i], err)
		}
	}
	return nil
}

func (m *mixClient) Close() {
	for _, p := range m.parts {
		p.Close()
	}
}

// httpClient is a model-API or plain HTTPS client of one sandbox.
type httpClient struct {
	hc    *http.Client
	tr    *http.Transport
	url   string
	model bool // POST Messages, every fourth one streamed (SSE)
	// conversation, when set, are earlier messages sent before the new one (WRouteConv).
	conversation []byte
}

func (c *httpClient) Close() { c.tr.CloseIdleConnections() }

func (c *httpClient) Do(ctx context.Context, seq int) error {
	var req *http.Request
	var err error
	stream := c.model && seq%4 == 3
	if c.model {
		body := fmt.Appendf(nil, `{"model":"claude-bench","max_tokens":256,"stream":%t,"messages":[`, stream)
		body = append(body, c.conversation...)
		body = fmt.Appendf(body, `{"role":"user","content":"Say hello to sandbox request %d"}]}`, seq)
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Anthropic-Version", "2023-06-01")
			req.Header.Set("X-Api-Key", "sk-sandbox-placeholder")
		}
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	}
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
	}
	if stream && !bytes.Contains(b, []byte("message_stop")) {
		return fmt.Errorf("stream ended early")
	}
	return nil
}

// mcpClient is one sandbox's MCP session (Streamable HTTP, JSON-RPC over POST).
type mcpClient struct {
	hc  *http.Client
	tr  *http.Transport
	url string
	sid string
	id  atomic.Int64
}

// Close ends the session with DELETE, as an MCP client that is done does (mcp-go's client.Close),
// so a cell does not leave its sessions in the proxy for the next cells to carry.
func (c *mcpClient) Close() {
	defer c.tr.CloseIdleConnections()
	if c.sid == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.url, nil)
	if err != nil {
		return
	}
	req.Header.Set("Mcp-Session-Id", c.sid)
	if resp, err := c.hc.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	c.sid = ""
}

func (c *mcpClient) post(ctx context.Context, body string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.sid != "" {
		req.Header.Set("Mcp-Session-Id", c.sid)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, nil, fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
	}
	return resp, b, nil
}

func (c *mcpClient) initialize(ctx context.Context) error {
	resp, _, err := c.post(ctx, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sandgate-bench","version":"1"}}}`)
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	c.sid = resp.Header.Get("Mcp-Session-Id")
	if _, _, err := c.post(ctx, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		return fmt.Errorf("initialized: %w", err)
	}
	return nil
}

func (c *mcpClient) Do(ctx context.Context, seq int) error {
	if c.sid == "" {
		if err := c.initialize(ctx); err != nil {
			return err
		}
	}
	id := c.id.Add(1)
	_, b, err := c.post(ctx, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello %d"}}}`, id, seq))
	if err != nil {
		return fmt.Errorf("tools/call: %w", err)
	}
	if !bytes.Contains(b, []byte(`"result"`)) || bytes.Contains(b, []byte(`"isError":true`)) {
		return fmt.Errorf("tools/call: %.200s", b)
	}
	return nil
}

// conversation is the earlier turns of WRouteConv's requests: 64 KiB of messages, each followed
// by a comma, with the quotes, backslashes and newlines that source code brings into a JSON
// string.
var conversation = func() []byte {
	var b []byte
	for i := 0; len(b) < 64<<10; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		text := strings.Repeat(fmt.Sprintf("%d: if err != nil {\n\treturn fmt.Errorf(\"step \\%d: %%w\", err)\n}\n", i, i), 12)
		quoted, _ := json.Marshal(text)
		b = fmt.Appendf(b, `{"role":%q,"content":[{"type":"text","text":%s}]},`, role, quoted)
	}
	return b
}()
