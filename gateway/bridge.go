package gateway

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/client"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// inflight tracks the calls forwarded to each upstream, so that what the upstream sends back
// about a call (progress, log messages, requests to the client) reaches the request that made
// it (route.go).
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
	ctx context.Context
	// dest is the sandbox's request the call answers now (nil for Sandgate's own requests): the
	// one that made it, or the retry that resumed it (2026-07-28's multi round-trip, mrtr.go).
	dest atomic.Pointer[exchange]
	sid  string // the sandbox session ("" on 2026-07-28, which has none)
	key  string
	seq  uint64
	// alias is its key under the sandbox's own progress token, on the sandbox's own upstream
	// session (alias), "" when none.
	alias string
	cli   *client.Client // the upstream connection it was sent on, once sent
}

// exchange is the request the call answers now, nil for one of Sandgate's own.
func (c *inflightCall) exchange() *exchange { return c.dest.Load() }

// progressToken is the sandbox's own progress token, nil if it asked for no progress.
func (c *inflightCall) progressToken() json.RawMessage {
	if x := c.exchange(); x != nil {
		return x.meta.progressToken
	}
	return nil
}

type inflightKey struct{}

// callOf is the call ctx forwards, nil if none.
func callOf(ctx context.Context) *inflightCall {
	c, _ := ctx.Value(inflightKey{}).(*inflightCall)
	return c
}

func newInflight() *inflight { return &inflight{calls: map[*upstream]map[string]*inflightCall{}} }

// begin registers a call of request x (nil: one of Sandgate's own) to u and returns a context
// carrying it and the progress token to send upstream ("" when the sandbox asked for no
// progress). The caller ends the call with end.
func (f *inflight) begin(ctx context.Context, x *exchange, u *upstream) (context.Context, *inflightCall, string) {
	n := f.next.Add(1)
	c := &inflightCall{ctx: ctx, key: "sg-" + strconv.FormatUint(n, 10), seq: n}
	token := ""
	if x != nil {
		c.dest.Store(x)
		c.sid = x.sid
		if x.meta.progressToken != nil {
			token = c.key
		}
	}
	f.mu.Lock()
	if f.calls[u] == nil {
		f.calls[u] = map[string]*inflightCall{}
	}
	f.calls[u][c.key] = c
	f.mu.Unlock()
	return context.WithValue(ctx, inflightKey{}, c), c, token
}

// bind records the connection call c is sent on.
func (f *inflight) bind(c *inflightCall, cli *client.Client) {
	f.mu.Lock()
	c.cli = cli
	f.mu.Unlock()
}

const protocolMetaPrefix = "io.modelcontextprotocol/"

func (f *inflight) end(u *upstream, c *inflightCall) {
	f.mu.Lock()
	delete(f.calls[u], c.key)
	if c.alias != "" {
		delete(f.calls[u], c.alias)
	}
	f.mu.Unlock()
}

// alias registers call c under the sandbox's own progress token on its own upstream session
// (sid), where the upstream's progress names that token.
func (f *inflight) alias(u *upstream, c *inflightCall, sid string, token json.RawMessage) {
	key := sid + "\x00" + string(token)
	f.mu.Lock()
	if c.alias != "" {
		delete(f.calls[u], c.alias)
	}
	c.alias = key
	f.calls[u][key] = c
	f.mu.Unlock()
}

// byToken is the call of u's whose progress token (raw, as the upstream wrote it) is token on
// upstream session sid: Sandgate's own on the shared session (""), the sandbox's own on its
// own session. A sandbox choosing a token like Sandgate's names no other sandbox's call.
func (f *inflight) byToken(u *upstream, sid string, token json.RawMessage) (*inflightCall, bool) {
	key, ok := jsonscan.PlainString(token)
	if sid != "" {
		key, ok = sid+"\x00"+string(token), true
	}
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
