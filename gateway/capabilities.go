package gateway

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/identity"
)

// An upstream may list some tools only to a client that declares a capability they need: the
// TypeScript reference server lists get-roots-list only to a client with roots,
// trigger-sampling-request only to one with sampling. The shared connection declares all of
// them (sharedCapabilities), so its catalog holds every tool; a sandbox is shown, of an
// upstream's tools, only those the upstream lists to a client with the sandbox's own
// capabilities, so that it never sees a tool that would fail for want of one:
//   - a sandbox session's own upstream session declares the sandbox's capabilities
//     (upstream_sessions.go), so the upstream treats the sandbox as it would directly;
//   - which tools a client of given capabilities is listed is asked of the upstream once per
//     combination of the capabilities a tool may need (sampling, elicitation, roots: at most 8
//     sessions of a few requests each, opened, listed and closed), again after each change of
//     the catalog, and applies to every sandbox of that combination, whatever its upstream
//     session, per-sandbox or shared (docs/mcp-gateway.md).
//
// A 2026-07-28 upstream has no sessions to declare capabilities in: each request carries
// Sandgate's, and its tools are not filtered by capability. Nor is a sandbox whose capabilities
// this replica does not know (a session adopted from another replica with no record of them).
// A 2026-07-28 sandbox declares its capabilities in each request: those of the request decide.

// capabilityClass is which of the capabilities a tool may need a client declared.
type capabilityClass uint8

const (
	classSampling capabilityClass = 1 << iota
	classElicitation
	classRoots
	classAll = classSampling | classElicitation | classRoots
)

func classOf(c mcp.ClientCapabilities) capabilityClass {
	var k capabilityClass
	if c.Sampling != nil {
		k |= classSampling
	}
	if c.Elicitation != nil {
		k |= classElicitation
	}
	if c.Roots != nil {
		k |= classRoots
	}
	return k
}

// capabilities are the client capabilities a probe of class k declares.
func (k capabilityClass) capabilities() mcp.ClientCapabilities {
	var c mcp.ClientCapabilities
	if k&classSampling != 0 {
		c.Sampling = sharedCapabilities.Sampling
	}
	if k&classElicitation != 0 {
		c.Elicitation = sharedCapabilities.Elicitation
	}
	if k&classRoots != 0 {
		c.Roots = sharedCapabilities.Roots
	}
	return c
}

// classLists are the tools an upstream lists to clients of each class, per catalog.
type classLists struct {
	mu      sync.Mutex
	byClass map[capabilityClass]*classList
}

type classList struct {
	ready chan struct{} // closed once listed; nil: not listed yet
	tools map[string]bool
	ok    bool
}

// reset forgets the lists: the catalog changed.
func (c *classLists) reset() {
	c.mu.Lock()
	c.byClass = nil
	c.mu.Unlock()
}

// A sandbox session's own upstream session lists tools declaring the sandbox's capabilities;
// what it lists is kept with the session (sandboxConn.tools) until it says its list changed.

// caller is who a list or a target is decided for: its identity, its legacy session ("" none),
// and on 2026-07-28 the client capabilities its request declares.
type caller struct {
	id     identity.Identity
	sid    string
	modern bool
	caps   *mcp.ClientCapabilities
}

// caller is the caller of x.
func (x *exchange) caller() caller {
	return caller{id: x.id, sid: x.sid, modern: x.modern, caps: x.meta.caps}
}

// sessionKey is the key of the caller's own upstream sessions: its legacy session, or on
// 2026-07-28 (which has none) its sandbox and the capabilities it declares, so that one sandbox
// has one upstream session per combination of them on a stateful upstream ("" for none).
func (c caller) sessionKey() string {
	if !c.modern {
		return c.sid
	}
	return modernKeyPrefix + strconv.Itoa(int(c.class())) + "/" + c.id.Key()
}

// modernKeyPrefix starts the session key of a 2026-07-28 sandbox's upstream sessions.
const modernKeyPrefix = "sandbox/"

// class is the caller's capability class on 2026-07-28 (none declared: 0).
func (c caller) class() capabilityClass {
	if c.caps == nil {
		return 0
	}
	return classOf(*c.caps)
}

// toolsFor is the names of the tools u lists to who, of class k: those its own upstream session
// lists, where it has one, else those a client of class k is listed. ok is false when they
// cannot be told (the upstream is down, or of a revision without sessions), and then no tool is
// held back for want of a capability.
func (u *upstream) toolsFor(ctx context.Context, who caller, k capabilityClass) (map[string]bool, bool) {
	cli, _, err := u.client()
	if err != nil || mcp.IsModernProtocol(cli.ProtocolVersion()) || cli.GetServerCapabilities().Tools == nil {
		return nil, false
	}
	if key := who.sessionKey(); key != "" && u.perSandbox(cli) {
		conn, err := u.sandboxConn(ctx, key, cli.ProtocolVersion())
		if err == nil {
			defer u.release(conn)
			return u.listOnce(&conn.tools, func() (map[string]bool, bool) { return u.listNames(ctx, conn.cli) })
		}
		if !errors.Is(err, errSessionsFull) {
			return nil, false
		}
	}
	c := &u.classes
	c.mu.Lock()
	if c.byClass == nil {
		c.byClass = map[capabilityClass]*classList{}
	}
	l := c.byClass[k]
	if l == nil {
		l = &classList{}
		c.byClass[k] = l
	}
	c.mu.Unlock()
	return u.listOnce(&l, func() (map[string]bool, bool) { return u.probeTools(ctx, cli.ProtocolVersion(), k) })
}

// listOnce returns the names *slot holds, listing them with list first if it holds none: one
// caller lists, the others wait for it.
func (u *upstream) listOnce(slot **classList, list func() (map[string]bool, bool)) (map[string]bool, bool) {
	u.pool.mu.Lock()
	l := *slot
	first := l == nil || l.ready == nil
	if first {
		l = &classList{ready: make(chan struct{})}
		*slot = l
	}
	u.pool.mu.Unlock()
	if first {
		l.tools, l.ok = list()
		close(l.ready)
	}
	<-l.ready
	return l.tools, l.ok
}

// listNames lists the names of cli's tools.
func (u *upstream) listNames(ctx context.Context, cli *client.Client) (map[string]bool, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.cfg.CallTimeout.D())
	defer cancel()
	entries, _, _, err := listAll(ctx, cli, listTools)
	if err != nil {
		u.log.Info("tools of a sandbox's upstream session not listed; none held back", "err", err)
		return nil, false
	}
	names := make(map[string]bool, len(entries))
	for _, e := range entries {
		names[e.id] = true
	}
	return names, true
}

// sessionListChanged forgets what sandbox session sid's upstream session lists: it said its
// list changed.
func (u *upstream) sessionListChanged(sid string) {
	u.pool.mu.Lock()
	if c, ok := u.pool.conns[sid]; ok {
		c.tools = nil
	}
	u.pool.mu.Unlock()
}

// probeTools opens a session declaring the capabilities of class k, lists its tools and closes
// it.
func (u *upstream) probeTools(ctx context.Context, version string, k capabilityClass) (map[string]bool, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.cfg.ConnectTimeout.D())
	defer cancel()
	cli, err := u.dial(ctx, version, probeHooks, k.capabilities(), false)
	if err != nil {
		u.log.Info("tools of a client without some capabilities not listed; none held back", "err", err)
		return nil, false
	}
	defer cli.Close()
	return u.listNames(ctx, cli)
}

// probeHooks answer nothing a probe's upstream sends: no sandbox is behind it.
var probeHooks = connHooks{
	notify: func(inbound) {},
	request: func(context.Context, inbound) clientReply {
		return errorReply(mcp.METHOD_NOT_FOUND, "no client behind this session")
	},
	attribute: func(*client.Client) *inflightCall { return nil },
}

// sandboxClass is the capability class of who; ok false when it is not known (a session adopted
// from another replica with no record of them).
func (g *Gateway) sandboxClass(who caller) (capabilityClass, bool) {
	if who.modern {
		return who.class(), true
	}
	ss := g.sandboxes.get(who.sid)
	if ss == nil {
		return 0, false
	}
	caps, known := ss.capabilities()
	return classOf(caps), known
}

// capability tells which tools the sandbox of one request may be shown for the capabilities it
// declared. It asks each upstream once (toolsFor leases the sandbox's upstream session), however
// many tools are checked: mcp-go filters every tools/call through the whole list.
type capability struct {
	g     *Gateway
	ctx   context.Context
	who   caller
	class capabilityClass
	known bool
	// lists are the upstreams' lists, as asked: few, so a slice over buf (a map was ~260 B of
	// every tools/call).
	lists []capabilityList
	buf   [2]capabilityList
}

type capabilityList struct {
	u     *upstream
	tools map[string]bool
	ok    bool
}

// capabilityOf is the capability check of who.
func (g *Gateway) capabilityOf(ctx context.Context, who caller) *capability {
	class, known := g.sandboxClass(who)
	c := &capability{g: g, ctx: ctx, who: who, class: class, known: known}
	c.lists = c.buf[:0]
	return c
}

// allows reports whether the sandbox may be shown tool name of u.
func (c *capability) allows(u *upstream, name string) bool {
	if !c.known || c.class == classAll {
		return true
	}
	for _, l := range c.lists {
		if l.u == u {
			return !l.ok || l.tools[name]
		}
	}
	l := capabilityList{u: u}
	l.tools, l.ok = u.toolsFor(c.ctx, c.who, c.class)
	c.lists = append(c.lists, l)
	return !l.ok || l.tools[name]
}
