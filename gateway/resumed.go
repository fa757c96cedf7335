package gateway

import (
	"context"
	"encoding/json"
)

// A sandbox reads the same bytes of an SSE event whether it reads it live or after resuming its
// stream with Last-Event-ID, on this replica or another:
//   - the event store records a response as the live stream writes it, with the result's extra
//     top-level fields (extras.go) already added (storedWithExtras), and shares those bytes;
//   - an event mcp-go delivers live to a resumed stream (the result of a call still running when
//     the sandbox resumed) is written as recorded (responseWriter): mcp-go hands a resumed
//     connection the message it marshalled, not the one the store recorded.

// storedWithExtras is msg, an event about to be recorded, as the live stream writes it: when it
// is the response to the request in ctx, with that result's extra fields.
func storedWithExtras(ctx context.Context, msg json.RawMessage) json.RawMessage {
	e, ok := ctx.Value(extrasKey{}).(*resultExtras)
	if !ok {
		return msg
	}
	out, err := e.complete(msg)
	if err != nil {
		return msg
	}
	return out
}

// recorded is the message recorded as event id of a session, if this replica has it.
func (s *eventStore) recorded(sessionID, id string) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	evs := s.sessions[sessionID]
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].id == id {
			return evs[i].msg, true
		}
	}
	return nil, false
}
