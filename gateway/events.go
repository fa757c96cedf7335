package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/sandgate/sandgate/internal/mcpsessions"
)

// maxEventsPerSession bounds what a session's SSE streams keep for resumption: a sandbox that
// reconnects with a Last-Event-ID older than the last this many events gets 404 on the GET and
// must retry its request.
const maxEventsPerSession = 512

// eventStore is mcp-go's EventStore for the sandbox-facing streams, kept in this replica's
// memory and bounded per session (mcp-go's in-memory store keeps every event until the session
// ends). With it, mcp-go gives every SSE event an ID, writes what a call sent before its
// result ahead of that result, and replays a stream after the Last-Event-ID a sandbox resumes
// with.
//
// With a shared event log (Redis, when the session store is one) every event is also appended
// there, in order, off the request's path, so that a stream can be resumed on another replica;
// an event the log does not have (Redis down, queue full) can be resumed on its own replica only.
// An unknown Last-Event-ID answers 400 and the sandbox sends its request again.
type eventStore struct {
	mu       sync.Mutex
	seq      uint64
	tag      string // this replica's prefix of event IDs, unique across replicas
	sessions map[string][]storedSSE

	shared mcpsessions.EventLog // nil: events stay on this replica
	ttl    time.Duration
	queue  chan sharedEvent
	log    *slog.Logger
}

// sharedEvent is one append to (or, with no event, a purge of) the shared log.
type sharedEvent struct {
	session string
	event   *mcpsessions.Event
}

type storedSSE struct {
	id, stream string
	msg        json.RawMessage
}

func newEventStore(shared mcpsessions.EventLog, ttl time.Duration, log *slog.Logger) *eventStore {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &eventStore{sessions: map[string][]storedSSE{}, tag: hex.EncodeToString(b), shared: shared, ttl: ttl,
		queue: make(chan sharedEvent, 4096), log: log}
}

// run writes the shared log until ctx ends.
func (s *eventStore) run(ctx context.Context) {
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
				err = s.shared.AppendEvent(ctx, op.session, *op.event, maxEventsPerSession, s.ttl)
			}
			if err != nil {
				s.log.Debug("shared mcp event log not written; streams resume on this replica only", "err", err)
			}
		}
	}
}

func (s *eventStore) share(op sharedEvent) {
	if s.shared == nil {
		return
	}
	select {
	case s.queue <- op:
	default:
		s.log.Debug("shared mcp event log queue full; event resumes on this replica only")
	}
}

var _ server.EventStore = (*eventStore)(nil)

func (s *eventStore) StoreEvent(ctx context.Context, sessionID, streamID string, msg json.RawMessage) (string, error) {
	if m, ok := unrelayed(msg); ok {
		msg = m
	}
	msg = storedWithExtras(ctx, msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	id := s.tag + "-" + strconv.FormatUint(s.seq, 10)
	evs := append(s.sessions[sessionID], storedSSE{id: id, stream: streamID, msg: msg})
	if len(evs) > maxEventsPerSession {
		evs = append(evs[:0:0], evs[len(evs)-maxEventsPerSession:]...)
	}
	s.sessions[sessionID] = evs
	s.share(sharedEvent{sessionID, &mcpsessions.Event{ID: id, Stream: streamID, Message: msg}})
	return id, nil
}

func (s *eventStore) ReplayEventsAfter(ctx context.Context, sessionID, lastEventID string, send func(string, json.RawMessage) error) (string, error) {
	s.mu.Lock()
	evs := s.sessions[sessionID]
	at := -1
	for i, e := range evs {
		if e.id == lastEventID {
			at = i
			break
		}
	}
	if at < 0 {
		s.mu.Unlock()
		return s.replayShared(ctx, sessionID, lastEventID, send)
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
		if err := send(e.id, e.msg); err != nil {
			return stream, err
		}
	}
	return stream, nil
}

// streamOf is the stream event id of a session belongs to, if this replica or the shared log
// has it.
func (s *eventStore) streamOf(ctx context.Context, sessionID, id string) (string, bool) {
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
func (s *eventStore) replayShared(ctx context.Context, sessionID, lastEventID string, send func(string, json.RawMessage) error) (string, error) {
	unknown := fmt.Errorf("event %q of session: %w", lastEventID, server.ErrUnknownEventID)
	if s.shared == nil {
		return "", unknown
	}
	stream, after, found, err := s.shared.EventsAfter(ctx, sessionID, lastEventID)
	if err != nil {
		s.log.Debug("shared mcp event log not readable", "err", err)
		return "", unknown
	}
	if !found {
		return "", unknown
	}
	for _, e := range after {
		if err := send(e.ID, e.Message); err != nil {
			return stream, err
		}
	}
	return stream, nil
}

func (s *eventStore) PurgeSession(_ context.Context, sessionID string) error {
	s.mu.Lock()
	delete(s.sessions, sessionID)
	s.mu.Unlock()
	s.share(sharedEvent{session: sessionID})
	return nil
}
