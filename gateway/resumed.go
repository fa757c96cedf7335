package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/mark3labs/mcp-go/server"
)

// A sandbox reads the same bytes of an SSE event whether it reads it live or after resuming its
// stream with Last-Event-ID, on this replica or another:
//   - the event store records a response as the live stream writes it, with the result's extra
//     top-level fields (extras.go) already added (storedWithExtras), and shares those bytes;
//   - an event mcp-go delivers live to a resumed stream (the result of a call still running when
//     the sandbox resumed) is written as recorded (resumedWriter): mcp-go hands a resumed
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

// resumed prepares the response to r, when r resumes a stream (a GET with Last-Event-ID), to
// write each event with an ID as recorded; w unchanged otherwise.
func (s *eventStore) resumed(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	if r.Method != http.MethodGet || r.Header.Get("Last-Event-ID") == "" {
		return w
	}
	return &resumedWriter{ResponseWriter: w, store: s, session: r.Header.Get(server.HeaderKeySessionID)}
}

// resumedWriter writes the data of each SSE event with an ID as the store recorded it. mcp-go
// writes an event's "id:" line and the rest of it in separate writes, whole lines each.
type resumedWriter struct {
	http.ResponseWriter
	store   *eventStore
	session string
	event   string // the ID of the event being written, until its blank line
}

func (w *resumedWriter) Write(p []byte) (int, error) {
	lines := bytes.Split(p, []byte("\n"))
	changed := false
	for i, l := range lines[:len(lines)-1] { // the last is what follows the last newline
		switch {
		case len(l) == 0:
			w.event = ""
		case bytes.HasPrefix(l, []byte("id:")):
			w.event = string(bytes.TrimSpace(l[len("id:"):]))
		case bytes.HasPrefix(l, []byte("data:")) && w.event != "":
			msg, ok := w.store.recorded(w.session, w.event)
			if ok && !bytes.Equal(bytes.TrimSpace(l[len("data:"):]), msg) {
				lines[i], changed = append([]byte("data: "), msg...), true
			}
		}
	}
	if !changed {
		return w.ResponseWriter.Write(p)
	}
	if _, err := w.ResponseWriter.Write(bytes.Join(lines, []byte("\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *resumedWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *resumedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
