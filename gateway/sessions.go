package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/identity"
)

var errUnknownSession = errors.New("unknown session")

// sessionStore issues sandbox session IDs (128 random bits), binds each to the source address
// that initialized it, and expires it after the idle timeout. It is mcp-go's session ID
// manager: mcp-go resolves one per request, and the store hands out a view bound to that
// request's peer.
type sessionStore struct {
	idle time.Duration
	mu   sync.Mutex
	byID map[string]*sessionEntry
}

type sessionEntry struct {
	peer     netip.Addr
	lastSeen time.Time
}

func newSessionStore(idle time.Duration) *sessionStore {
	return &sessionStore{idle: idle, byID: map[string]*sessionEntry{}}
}

// ResolveSessionIdManager implements server.SessionIdManagerResolver. r is nil for mcp-go's
// background sweeper.
func (s *sessionStore) ResolveSessionIdManager(r *http.Request) server.SessionIdManager {
	v := sessionView{s: s}
	if r != nil {
		v.peer, _ = identity.ParsePeer(r.RemoteAddr)
	}
	return v
}

// valid reports whether id is live and was created by peer; it refreshes its idle timer.
func (s *sessionStore) valid(id string, peer netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if !ok || e.peer != peer {
		return false
	}
	if time.Since(e.lastSeen) > s.idle {
		delete(s.byID, id)
		return false
	}
	e.lastSeen = time.Now()
	return true
}

// sweep ends idle sessions until ctx ends.
func (s *sessionStore) sweep(ctx context.Context, ended func(id string)) {
	t := time.NewTicker(min(max(s.idle/4, 10*time.Millisecond), 30*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var expired []string
		s.mu.Lock()
		for id, e := range s.byID {
			if time.Since(e.lastSeen) > s.idle {
				delete(s.byID, id)
				expired = append(expired, id)
			}
		}
		s.mu.Unlock()
		for _, id := range expired {
			ended(id)
		}
	}
}

type sessionView struct {
	s    *sessionStore
	peer netip.Addr
}

func (v sessionView) Generate() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	v.s.mu.Lock()
	v.s.byID[id] = &sessionEntry{peer: v.peer, lastSeen: time.Now()}
	v.s.mu.Unlock()
	return id
}

func (v sessionView) Validate(id string) (bool, error) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	e, ok := v.s.byID[id]
	if !ok || (v.peer.IsValid() && e.peer != v.peer) {
		return false, errUnknownSession
	}
	return false, nil
}

func (v sessionView) Terminate(id string) (bool, error) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if e, ok := v.s.byID[id]; ok && (!v.peer.IsValid() || e.peer == v.peer) {
		delete(v.s.byID, id)
	}
	return false, nil
}
