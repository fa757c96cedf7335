package gateway

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// inflight tracks the calls forwarded to each upstream, so that what the upstream sends back
// about a call (progress, log messages, requests to the client) reaches the sandbox session
// that made it (route.go).
//
// Progress tokens are rewritten: the upstream sees a token Sandgate made ("sg-N"), unique
// across sandboxes sharing the upstream session, and the sandbox sees its own token again.
type inflight struct {
	next  atomic.Uint64
	mu    sync.Mutex
	calls map[*upstream]map[string]*inflightCall
}

// inflightCall is one forwarded call.
type inflightCall struct {
	ctx   context.Context   // the sandbox's request (its mcp-go session: the call's stream)
	sid   string            // the sandbox session ("" on 2026-07-28, which has none)
	token mcp.ProgressToken // the sandbox's own token, nil if it asked for no progress
	key   string
	seq   uint64
	cli   *client.Client // the upstream connection it was sent on, once sent
}

type inflightKey struct{}

// callOf is the call ctx forwards, nil if none.
func callOf(ctx context.Context) *inflightCall {
	c, _ := ctx.Value(inflightKey{}).(*inflightCall)
	return c
}

func newInflight() *inflight { return &inflight{calls: map[*upstream]map[string]*inflightCall{}} }

// begin registers a call and returns a context carrying it and the _meta to send upstream (nil
// when there is none: a progress token goes upstream only when the sandbox asked for
// progress). The caller ends the call with end.
func (f *inflight) begin(ctx context.Context, u *upstream, meta *mcp.Meta) (context.Context, *inflightCall, *mcp.Meta) {
	n := f.next.Add(1)
	c := &inflightCall{ctx: ctx, key: "sg-" + strconv.FormatUint(n, 10), seq: n}
	if s := server.ClientSessionFromContext(ctx); s != nil {
		c.sid = s.SessionID()
	}
	var out *mcp.Meta
	if meta != nil {
		c.token = meta.ProgressToken
		out = &mcp.Meta{AdditionalFields: upstreamMeta(meta.AdditionalFields)}
		if c.token != nil {
			out.ProgressToken = c.key
		}
		if out.ProgressToken == nil && out.AdditionalFields == nil {
			out = nil
		}
	}
	f.mu.Lock()
	if f.calls[u] == nil {
		f.calls[u] = map[string]*inflightCall{}
	}
	f.calls[u][c.key] = c
	f.mu.Unlock()
	return context.WithValue(ctx, inflightKey{}, c), c, out
}

// bind records the connection call c is sent on.
func (f *inflight) bind(c *inflightCall, cli *client.Client) {
	f.mu.Lock()
	c.cli = cli
	f.mu.Unlock()
}

// upstreamMeta is the sandbox's _meta as forwarded upstream: without the protocol's own
// "io.modelcontextprotocol/" keys (protocol version, client info and capabilities, log level),
// which describe the sandbox's hop to Sandgate; the upstream hop has its own, negotiated by
// Sandgate. Forwarding a sandbox's 2026-07-28 protocol version to an upstream session on an
// older revision makes the upstream refuse the call (header mismatch).
func upstreamMeta(fields map[string]any) map[string]any {
	out := make(map[string]any, len(fields))
	for k, v := range fields {
		if !strings.HasPrefix(k, protocolMetaPrefix) {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

const protocolMetaPrefix = "io.modelcontextprotocol/"

func (f *inflight) end(u *upstream, c *inflightCall) {
	f.mu.Lock()
	delete(f.calls[u], c.key)
	f.mu.Unlock()
}

func (f *inflight) byToken(u *upstream, token any) (*inflightCall, bool) {
	key, ok := token.(string)
	if !ok {
		return nil, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.calls[u][key]
	return c, ok
}

// on is the call a message of connection cli that names no request (a log message, a request
// to the client) belongs to, where a stdio connection's one pipe cannot say: the call in flight
// on it when there is exactly one; on a sandbox session's own connection (sid) the oldest of
// that session's calls; nil otherwise.
func (f *inflight) on(u *upstream, cli *client.Client, sid string) *inflightCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var found *inflightCall
	n := 0
	for _, c := range f.calls[u] {
		if c.cli != cli {
			continue
		}
		n++
		if found == nil || c.seq < found.seq {
			found = c
		}
	}
	if n > 1 && sid == "" {
		return nil
	}
	return found
}
