package mcpsessions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// SharedRefresh is how often a session in use extends its shared record. It also bounds how long
// a session terminated on another replica stays usable on this one.
const SharedRefresh = time.Second

// Sessions issues MCP session IDs (128 random bits) at initialize (revisions before
// 2026-07-28, which have sessions), binds each to the source address that initialized it, and
// expires it after the idle timeout.
//
// With a shared store every session is also recorded there, so that another
// replica can continue it: an ID this replica does not know is looked up in the shared store and
// adopted when the record's source address is the caller's, with the client's info,
// capabilities and protocol version it recorded. A shared store that cannot be reached leaves
// sessions local: new ones still work on their replica, unknown ones get 404.
type Sessions struct {
	now    func() time.Time // time.Now; tests advance their own
	idle   time.Duration
	shared Store // nil: sessions stay on this replica
	log    *slog.Logger
	ended  func(id string)
	mu     sync.Mutex
	byID   map[string]*sessionEntry
}

type sessionEntry struct {
	peer      netip.Addr
	lastSeen  time.Time
	refreshed time.Time // last extension of the shared record
	// record is the session's shared record: shared again if Redis lost it, and restored onto
	// mcp-go's session objects when the session was adopted from another replica.
	record  *Record
	adopted bool
}

// NewSessions is a session store expiring sessions idle for idle, sharing them in shared (nil:
// none), telling ended of every session a client or another replica ended, or that expired. now
// is time.Now unless a test sets its own.
func NewSessions(idle time.Duration, shared Store, ended func(id string), log *slog.Logger, now func() time.Time) *Sessions {
	if now == nil {
		now = time.Now
	}
	return &Sessions{now: now, idle: idle, shared: shared, ended: ended, log: log, byID: map[string]*sessionEntry{}}
}

// Found is what Check found of a session ID.
type Found int

const (
	Known    Found = iota
	Unknown        // never issued, expired or terminated
	NotOwned       // live, but created by another source address: a hijack attempt
)

// Check says whether id is live and was created by peer; it refreshes its idle timer. An ID
// unknown here is looked up in the shared store and adopted when peer created it.
func (s *Sessions) Check(ctx context.Context, id string, peer netip.Addr) Found {
	s.mu.Lock()
	e, ok := s.byID[id]
	if ok && s.now().Sub(e.lastSeen) > s.idle {
		delete(s.byID, id)
		ok = false
	}
	if ok {
		if e.peer != peer {
			s.mu.Unlock()
			return NotOwned
		}
		now := s.now()
		e.lastSeen = now
		refresh := s.shared != nil && now.Sub(e.refreshed) >= SharedRefresh
		if refresh {
			e.refreshed = now
		}
		rec := e.record
		s.mu.Unlock()
		if refresh {
			switch st, err := s.shared.Refresh(ctx, id, s.idle); {
			case err != nil:
				s.log.Warn("shared mcp session store unavailable", "err", err)
			case st == Terminated: // ended on another replica
				s.drop(id)
				s.ended(id)
				return Unknown
			case st == Missing && rec != nil: // Redis lost it: share it again
				if err := s.shared.Put(ctx, id, *rec, s.idle); err != nil {
					s.log.Warn("shared mcp session store unavailable", "err", err)
				}
			}
		}
		return Known
	}
	s.mu.Unlock()
	if s.shared == nil {
		return Unknown
	}
	rec, found, err := s.shared.Get(ctx, id)
	if err != nil {
		s.log.Warn("shared mcp session store unavailable", "err", err)
		return Unknown
	}
	if !found {
		return Unknown
	}
	if rec.Peer != peer.String() {
		return NotOwned
	}
	now := s.now()
	s.mu.Lock()
	s.byID[id] = &sessionEntry{peer: peer, lastSeen: now, refreshed: now, record: &rec, adopted: true}
	s.mu.Unlock()
	if _, err := s.shared.Refresh(ctx, id, s.idle); err != nil {
		s.log.Warn("shared mcp session store unavailable", "err", err)
	}
	return Known
}

// Count counts the live sessions on this replica.
func (s *Sessions) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// CountPeer counts the live sessions peer created on this replica.
func (s *Sessions) CountPeer(peer netip.Addr) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	now := s.now()
	for _, e := range s.byID {
		if e.peer == peer && now.Sub(e.lastSeen) <= s.idle {
			n++
		}
	}
	return n
}

func (s *Sessions) drop(id string) {
	s.mu.Lock()
	delete(s.byID, id)
	s.mu.Unlock()
}

// Initialized records what the client told in initialize, for other replicas.
func (s *Sessions) Initialized(ctx context.Context, id string, info mcp.Implementation, caps mcp.ClientCapabilities, version string) {
	s.mu.Lock()
	e, ok := s.byID[id]
	var rec Record
	if ok {
		rec = Record{Peer: e.peer.String(), ProtocolVersion: version,
			ClientInfo: info, Capabilities: caps, Initialized: true}
		e.record = &rec
	}
	if s.shared == nil {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	if err := s.shared.Put(ctx, id, rec, s.idle); err != nil {
		s.log.Warn("mcp session not shared; it works on this replica only", "err", err)
	}
}

// Record is session id's shared record, nil if there is none.
func (s *Sessions) Record(id string) *Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.byID[id]; ok {
		return e.record
	}
	return nil
}

// Sweep ends idle sessions until ctx ends.
func (s *Sessions) Sweep(ctx context.Context) {
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
			if s.now().Sub(e.lastSeen) > s.idle {
				delete(s.byID, id)
				expired = append(expired, id)
			}
		}
		s.mu.Unlock()
		for _, id := range expired {
			s.ended(id)
		}
	}
}

// Create issues a new session for peer.
func (s *Sessions) Create(peer netip.Addr) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	now := s.now()
	s.mu.Lock()
	rec := Record{Peer: peer.String()}
	s.byID[id] = &sessionEntry{peer: peer, lastSeen: now, refreshed: now, record: &rec}
	s.mu.Unlock()
	if s.shared != nil {
		if err := s.shared.Put(context.Background(), id, rec, s.idle); err != nil {
			s.log.Warn("mcp session not shared; it works on this replica only", "err", err)
		}
	}
	return id
}

// Terminate ends session id of peer (DELETE): here, and for the other replicas.
func (s *Sessions) Terminate(id string, peer netip.Addr) {
	s.mu.Lock()
	e, ok := s.byID[id]
	mine := ok && e.peer == peer
	if mine {
		delete(s.byID, id)
	}
	s.mu.Unlock()
	if mine {
		s.ended(id)
	}
	if mine && s.shared != nil {
		if err := s.shared.Terminate(context.Background(), id, s.idle); err != nil {
			s.log.Warn("terminated mcp session not removed from the shared store; it expires with its idle timeout", "err", err)
		}
	}
}
