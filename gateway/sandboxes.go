package gateway

import (
	"context"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/internal/identity"
)

// sandboxSession is what the gateway keeps of one sandbox session (a session of the legacy
// revisions, which have them): its GET stream, the capabilities and log level its client
// declared, what its lists last showed, and a context that ends with the session.
//
// It is also the session mcp-go knows by that ID (registered at initialize). mcp-go serves a
// POST of a session it knows as a session of its own type from its shared message channel,
// which every concurrent POST and the GET stream of the session read from: a call's
// notifications could land on another call's stream or on the GET stream, in any order. With
// this one registered instead, mcp-go serves each POST with a session of its own, whose channel
// only that POST's stream reads: what is sent to a call reaches that call, in order, before its
// result. What mcp-go itself broadcasts to registered sessions (its list_changed, sent on every
// catalog update) is dropped: the gateway tells each sandbox what changed in its own lists
// (listchanged.go), on the GET stream it serves itself (sandboxstream.go).
type sandboxSession struct {
	id     string
	ctx    context.Context // ends with the session: its calls are cancelled
	cancel context.CancelFunc
	stream *sandboxStream
	drop   chan mcp.JSONRPCNotification // mcp-go's broadcasts, drained and dropped

	mu      sync.Mutex
	info    mcp.Implementation
	caps    mcp.ClientCapabilities
	version string
	known   bool              // initialize told info, caps and version
	level   mcp.LoggingLevel  // logging/setLevel; mcp-go's default (error) until set
	who     identity.Identity // the caller, as of the session's last request
	shown   map[mcp.MCPMethod]map[string]bool
}

var _ server.ClientSession = (*sandboxSession)(nil)

func (s *sandboxSession) SessionID() string { return s.id }
func (s *sandboxSession) Initialize()       {}
func (s *sandboxSession) Initialized() bool { return true }

func (s *sandboxSession) NotificationChannel() chan<- mcp.JSONRPCNotification { return s.drop }

// sandboxRegistry is the sandbox sessions this replica serves, by ID.
type sandboxRegistry struct {
	g    *Gateway
	mu   sync.Mutex
	byID map[string]*sandboxSession
	// dropped receives what mcp-go broadcasts to the sessions; one goroutine discards it.
	dropped chan mcp.JSONRPCNotification
}

func newSandboxRegistry(g *Gateway) *sandboxRegistry {
	return &sandboxRegistry{g: g, byID: map[string]*sandboxSession{}, dropped: make(chan mcp.JSONRPCNotification, 256)}
}

// discard drains mcp-go's broadcasts until ctx ends.
func (ss *sandboxRegistry) discard(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ss.dropped:
		}
	}
}

// get is session id, nil when this replica does not serve it.
func (ss *sandboxRegistry) get(id string) *sandboxSession {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.byID[id]
}

// open returns session id, made and registered with mcp-go on first use: at initialize, or at
// the first request of a session adopted from another replica.
func (ss *sandboxRegistry) open(ctx context.Context, id string) *sandboxSession {
	ss.mu.Lock()
	s, ok := ss.byID[id]
	if !ok {
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s = &sandboxSession{id: id, ctx: sctx, cancel: cancel, drop: ss.dropped}
		s.stream = newSandboxStream(ss.g.events, id, ss.g.log)
		ss.byID[id] = s
	}
	ss.mu.Unlock()
	if !ok {
		// Registered before mcp-go registers its own (initialize) or ever sees the ID (adopted).
		_ = ss.g.mcp.RegisterSession(ctx, s)
	}
	return s
}

// sessionOf is the sandbox session of the request of ctx, nil if none.
func (g *Gateway) sessionOf(ctx context.Context) *sandboxSession {
	if s := server.ClientSessionFromContext(ctx); s != nil && s.SessionID() != "" {
		return g.sandboxes.get(s.SessionID())
	}
	return nil
}

// close ends session id: its calls are cancelled, its GET stream closed.
func (ss *sandboxRegistry) close(id string) {
	ss.mu.Lock()
	s, ok := ss.byID[id]
	delete(ss.byID, id)
	ss.mu.Unlock()
	if ok {
		s.cancel()
		s.stream.close()
	}
}

// all is every session served now.
func (ss *sandboxRegistry) all() []*sandboxSession {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*sandboxSession, 0, len(ss.byID))
	for _, s := range ss.byID {
		out = append(out, s)
	}
	return out
}

// initialized records what the client declared in initialize.
func (s *sandboxSession) initialized(info mcp.Implementation, caps mcp.ClientCapabilities, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.info, s.caps, s.version, s.known = info, caps, version, true
}

// capabilities are the client capabilities the sandbox declared; ok false before initialize
// told them (a session adopted from another replica that had no record of them).
func (s *sandboxSession) capabilities() (mcp.ClientCapabilities, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.caps, s.known
}

func (s *sandboxSession) setLevel(l mcp.LoggingLevel) {
	s.mu.Lock()
	s.level = l
	s.mu.Unlock()
}

// wantsLog reports whether a log message of level passes the level the sandbox set (mcp-go's
// default, error, until it sets one).
func (s *sandboxSession) wantsLog(level mcp.LoggingLevel) bool {
	s.mu.Lock()
	min := s.level
	s.mu.Unlock()
	if min == "" {
		min = mcp.LoggingLevelError
	}
	return level.ShouldSendTo(min)
}

// seen records the caller of the session's latest request.
func (s *sandboxSession) seen(who identity.Identity) {
	s.mu.Lock()
	s.who = who
	s.mu.Unlock()
}

func (s *sandboxSession) identity() identity.Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.who
}

// restore gives the session object mcp-go made for one request what initialize declared:
// mcp-go makes one per request (see sandboxSession), and hooks and handlers read the client's
// info, capabilities and protocol version from it.
func (s *sandboxSession) restore(sess server.ClientSession) {
	s.mu.Lock()
	info, caps, version, known := s.info, s.caps, s.version, s.known
	s.mu.Unlock()
	if !known {
		return
	}
	if ci, ok := sess.(server.SessionWithClientInfo); ok && ci.GetClientInfo().Name == "" {
		ci.SetClientInfo(info)
		ci.SetClientCapabilities(caps)
	}
	if v, ok := sess.(interface {
		ProtocolVersion() string
		SetProtocolVersion(string)
	}); ok && v.ProtocolVersion() == "" && version != "" {
		v.SetProtocolVersion(version)
	}
}

// hasCapability reports whether the sandbox's client declared what a server request of method
// needs (ping needs nothing).
func (s *sandboxSession) hasCapability(method string) bool {
	caps, known := s.capabilities()
	if !known {
		return true // declared on another replica: the sandbox's client decides
	}
	switch mcp.MCPMethod(method) {
	case mcp.MethodSamplingCreateMessage:
		return caps.Sampling != nil
	case mcp.MethodElicitationCreate:
		return caps.Elicitation != nil
	case mcp.MethodListRoots:
		return caps.Roots != nil
	}
	return true
}
