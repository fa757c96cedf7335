package gateway

import (
	"bytes"
	"net/http"

	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/sse"
)

// responseWriter is the writer mcp-go answers a sandbox's request through (guard), between
// mcp-go and the response guard. It writes each message as the sandbox must read it:
//   - an SSE event the event store recorded (it has an ID) as recorded: the bytes a replay of
//     it sends (resumed.go), which are also the ones below;
//   - a relay notification (outbound.go) as the message it carries;
//   - the response to the request with the result's extra fields added (extras.go), on an SSE
//     stream and in a JSON body alike.
type responseWriter struct {
	http.ResponseWriter
	store  *eventStore
	sid    string
	extras *resultExtras // nil: the method's results have none
	events *eventRewriter
}

func newResponseWriter(w http.ResponseWriter, store *eventStore, sid string, extras *resultExtras) *responseWriter {
	return &responseWriter{ResponseWriter: w, store: store, sid: sid, extras: extras}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if respguard.IsEventStream(w.Header()) {
		if w.events == nil {
			w.events = &eventRewriter{w: w.ResponseWriter, rewrite: w.event}
		}
		return w.events.Write(p)
	}
	if !w.extras.kept() {
		return w.ResponseWriter.Write(p)
	}
	out := rewriteMessages(p, w.Header().Get("Content-Type"), w.extras.complete)
	if _, err := w.ResponseWriter.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// event is ev as the sandbox reads it; false when that is ev itself.
func (w *responseWriter) event(ev sse.Event) ([]byte, bool) {
	if ev.ID != "" && w.sid != "" {
		if msg, ok := w.store.recorded(w.sid, ev.ID); ok {
			return msg, !bytes.Equal(msg, ev.Data)
		}
	}
	data, changed := ev.Data, false
	if m, ok := unrelayed(data); ok {
		data, changed = m, true
	}
	if w.extras.kept() {
		if out, err := w.extras.complete(data); err == nil {
			data, changed = out, true
		}
	}
	return data, changed
}

// end writes what is held: the response is over.
func (w *responseWriter) end() {
	if w.events != nil {
		_ = w.events.end()
	}
}

func (w *responseWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
