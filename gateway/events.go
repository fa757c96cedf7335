package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/mark3labs/mcp-go/server"
)

// maxEventsPerSession bounds what a session's SSE streams keep for resumption: a sandbox that
// reconnects with a Last-Event-ID older than the last this many events gets 404 on the GET and
// must retry its request.
const maxEventsPerSession = 512

// eventStore is mcp-go's EventStore for the sandbox-facing streams, kept in this replica's
// memory and bounded per session (mcp-go's in-memory store keeps every event until the session
// ends). With it, mcp-go gives every SSE event an ID, writes what a call sent before its
// result ahead of that result, and replays a stream after the Last-Event-ID a sandbox resumes
// with. A stream can be resumed on the replica that served it; another replica answers 404 and
// the sandbox retries the request.
type eventStore struct {
	mu       sync.Mutex
	seq      uint64
	sessions map[string][]storedSSE
}

type storedSSE struct {
	id, stream string
	msg        json.RawMessage
}

func newEventStore() *eventStore { return &eventStore{sessions: map[string][]storedSSE{}} }

var _ server.EventStore = (*eventStore)(nil)

func (s *eventStore) StoreEvent(_ context.Context, sessionID, streamID string, msg json.RawMessage) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	id := strconv.FormatUint(s.seq, 10)
	evs := append(s.sessions[sessionID], storedSSE{id: id, stream: streamID, msg: msg})
	if len(evs) > maxEventsPerSession {
		evs = append(evs[:0:0], evs[len(evs)-maxEventsPerSession:]...)
	}
	s.sessions[sessionID] = evs
	return id, nil
}

func (s *eventStore) ReplayEventsAfter(_ context.Context, sessionID, lastEventID string, send func(string, json.RawMessage) error) (string, error) {
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
		return "", fmt.Errorf("event %q of session: %w", lastEventID, server.ErrUnknownEventID)
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

func (s *eventStore) PurgeSession(_ context.Context, sessionID string) error {
	s.mu.Lock()
	delete(s.sessions, sessionID)
	s.mu.Unlock()
	return nil
}
