package mcpsessions

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"
)

// MaxEventsPerSession bounds what a session's SSE streams keep for resumption: a sandbox that
// reconnects with a Last-Event-ID older than the last this many events gets 404 on the GET and
// must retry its request.
const MaxEventsPerSession = 512

// Events records the SSE events of MCP sessions' streams (a call's, and the session's GET
// stream), in this replica's memory and bounded per session: every event has an ID, and a
// stream is replayed after the Last-Event-ID a client resumes with.
//
// With a shared event log (Redis, when the session store is one) every event is also appended
// there, in order, off the request's path, so that a stream can be resumed on another replica;
// an event the log does not have (Redis down, queue full) can be resumed on its own replica only.
// An unknown Last-Event-ID answers 400 and the sandbox sends its request again.
type Events struct {
	mu       sync.Mutex
	seq      uint64
	tag      string // this replica's prefix of event IDs, unique across replicas
	sessions map[string][]storedSSE

	shared EventLog // nil: events stay on this replica
	ttl    time.Duration
	queue  chan sharedEvent
	log    *slog.Logger
}

// sharedEvent is one append to (or, with no event, a purge of) the shared log.
type sharedEvent struct {
	session string
	event   *Event
}

type storedSSE struct {
	id, stream string
	msg        json.RawMessage
}

// NewEvents is a store of events sharing them in shared (nil: none), where they expire after ttl.
func NewEvents(shared EventLog, ttl time.Duration, log *slog.Logger) *Events {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &Events{sessions: map[string][]storedSSE{}, tag: hex.EncodeToString(b), shared: shared, ttl: ttl,
		queue: make(chan sharedEvent, 4096), log: log}
}

// Run writes the shared log until ctx ends.
func (s *Events) Run(ctx context.Context) {
	if s.shared == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case op := <-s.queue:
			var err error
			if op.event == nil {
				err = s.shared.PurgeEvents(ctx, op.session)
			} else {
				err = s.shared.AppendEvent(ctx, op.session, *op.event, MaxEventsPerSession, s.ttl)
			}
			if err != nil {
				s.log.Debug("shared mcp event log not written; streams resume on this replica only", "err", err)
			}
		}
	}
}

func (s *Events) share(op sharedEvent) {
	if s.shared == nil {
		return
	}
	select {
	case s.queue <- op:
	default:
		s.log.Debug("shared mcp event log queue full; event resumes on this replica only")
	}
}

// NewStream is the ID of a new stream of a session.
func (s *Events) NewStream() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return "s" + strconv.FormatUint(s.seq, 10)
}

// NextID is a new event ID, unique across replicas ("" for no session: nothing is recorded).
func (s *Events) NextID(sessionID string) string {
	if sessionID == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.tag + "-" + strconv.FormatUint(s.seq, 10)
}

// Store records msg as the next event of a session's stream and returns its ID.
func (s *Events) Store(sessionID, streamID string, msg []byte) string {
	id := s.NextID(sessionID)
	s.StoreAs(sessionID, streamID, id, msg)
	return id
}

// StoreAs records msg as event id (from NextID) of a session's stream.
func (s *Events) StoreAs(sessionID, streamID, id string, msg []byte) {
	if sessionID == "" || id == "" {
		return
	}
	msg = bytes.Clone(msg)
	s.mu.Lock()
	evs := append(s.sessions[sessionID], storedSSE{id: id, stream: streamID, msg: msg})
	if len(evs) > MaxEventsPerSession {
		evs = append(evs[:0:0], evs[len(evs)-MaxEventsPerSession:]...)
	}
	s.sessions[sessionID] = evs
	s.mu.Unlock()
	s.share(sharedEvent{sessionID, &Event{ID: id, Stream: streamID, Message: msg}})
}

// Replay calls send with each event of the stream event last belongs to that followed it (this
// replica's, else the shared log's); false when neither knows last.
func (s *Events) Replay(sessionID, last string, send func(id string, msg []byte)) bool {
	s.mu.Lock()
	evs := s.sessions[sessionID]
	at := slices.IndexFunc(evs, func(e storedSSE) bool { return e.id == last })
	if at < 0 {
		s.mu.Unlock()
		return s.replayShared(sessionID, last, send)
	}
	stream := evs[at].stream
	var replay []storedSSE
	for _, e := range evs[at+1:] {
		if e.stream == stream {
			replay = append(replay, e)
		}
	}
	s.mu.Unlock()
	for _, e := range replay {
		send(e.id, e.msg)
	}
	return true
}

// StreamOf is the stream event id of a session belongs to, if this replica or the shared log
// has it.
func (s *Events) StreamOf(ctx context.Context, sessionID, id string) (string, bool) {
	s.mu.Lock()
	for _, e := range s.sessions[sessionID] {
		if e.id == id {
			s.mu.Unlock()
			return e.stream, true
		}
	}
	s.mu.Unlock()
	if s.shared == nil {
		return "", false
	}
	stream, _, found, err := s.shared.EventsAfter(ctx, sessionID, id)
	return stream, err == nil && found
}

// replayShared replays from the shared log an event another replica wrote.
func (s *Events) replayShared(sessionID, last string, send func(id string, msg []byte)) bool {
	if s.shared == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedReadTimeout)
	defer cancel()
	_, after, found, err := s.shared.EventsAfter(ctx, sessionID, last)
	if err != nil {
		s.log.Debug("shared mcp event log not readable", "err", err)
		return false
	}
	if !found {
		return false
	}
	for _, e := range after {
		send(e.ID, e.Message)
	}
	return true
}

// sharedReadTimeout bounds a read of the shared event log.
const sharedReadTimeout = 2 * time.Second

// Purge forgets a session's events.
func (s *Events) Purge(sessionID string) {
	s.mu.Lock()
	delete(s.sessions, sessionID)
	s.mu.Unlock()
	s.share(sharedEvent{session: sessionID})
}

// Recorded is what is kept of session's events on this replica, oldest first.
func (s *Events) Recorded(session string) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, 0, len(s.sessions[session]))
	for _, e := range s.sessions[session] {
		out = append(out, Event{ID: e.id, Stream: e.stream, Message: e.msg})
	}
	return out
}
