package gateway

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/identity"
)

// sandboxSession is what the gateway keeps of one sandbox session (a session of the legacy
// revisions, which have them): its GET stream and the streams of its calls still running, the
// capabilities and log level its client declared, what its lists last showed, and a context that
// ends with the session.
type sandboxSession struct {
	id     string
	ctx    context.Context // ends with the session: its calls are cancelled
	cancel context.CancelFunc
	stream *sandboxStream

	mu      sync.Mutex
	info    mcp.Implementation
	caps    mcp.ClientCapabilities
	version string
	known   bool              // initialize told info, caps and version
	level   mcp.LoggingLevel  // logging/setLevel; error until set
	who     identity.Identity // the caller, as of the session's last request
	shown   map[mcp.MCPMethod]map[string]bool
	calls   map[string]*answer            // the streams of the session's calls still running, by stream ID
	cancels map[string]context.CancelFunc // the calls running, by the sandbox's request ID
}

// sandboxRegistry is the sandbox sessions this replica serves, by ID.
type sandboxRegistry struct {
	g    *Gateway
	mu   sync.Mutex
	byID map[string]*sandboxSession
}

func newSandboxRegistry(g *Gateway) *sandboxRegistry {
	return &sandboxRegistry{g: g, byID: map[string]*sandboxSession{}}
}

// get is session id, nil when this replica does not serve it.
func (ss *sandboxRegistry) get(id string) *sandboxSession {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.byID[id]
}

// open returns session id, made on first use: at initialize, or at the first request of a
// session adopted from another replica.
func (ss *sandboxRegistry) open(id string) *sandboxSession {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.byID[id]
	if !ok {
		sctx, cancel := context.WithCancel(context.Background())
		s = &sandboxSession{id: id, ctx: sctx, cancel: cancel, calls: map[string]*answer{}, cancels: map[string]context.CancelFunc{}}
		s.stream = newSandboxStream(ss.g.events, id, ss.g.log)
		ss.byID[id] = s
	}
	return s
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
	return slices.Collect(maps.Values(ss.byID))
}

// running registers a call's stream while it runs (a GET may resume it: answer.attach); the
// returned function removes it.
func (s *sandboxSession) running(a *answer) func() {
	s.mu.Lock()
	s.calls[a.stream] = a
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.calls, a.stream)
		s.mu.Unlock()
	}
}

// cancellable registers cancel as what notifications/cancelled of request id cancels; the
// returned function removes it.
func (s *sandboxSession) cancellable(id []byte, cancel context.CancelFunc) func() {
	key := string(id)
	s.mu.Lock()
	s.cancels[key] = cancel
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.cancels, key)
		s.mu.Unlock()
	}
}

// cancelRequest cancels the call of request id, if it runs.
func (s *sandboxSession) cancelRequest(id []byte) {
	s.mu.Lock()
	cancel := s.cancels[string(id)]
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// call is the running call whose stream is stream, nil when none is.
func (s *sandboxSession) call(stream string) *answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[stream]
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

// wantsLog reports whether a log message of level passes the level the sandbox set (error
// until it sets one, as mcp-go's servers have it).
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

// hasCapability reports whether the sandbox's client declared what a server request of method
// needs (ping needs nothing).
func (s *sandboxSession) hasCapability(method string) bool {
	caps, known := s.capabilities()
	if !known {
		return true // declared on another replica: the sandbox's client decides
	}
	has, _ := capabilityFor(caps, method)
	return has
}
