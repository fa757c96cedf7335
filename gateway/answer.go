package gateway

import (
	"bytes"
	"net/http"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/call"
)

// answer is how the gateway writes what answers one sandbox request: the JSON-RPC response
// alone (application/json), or, once anything else concerns the request (a notification, a
// request to the client), an SSE stream of those messages in the order they came, ending with
// the response. Every byte goes through the request's response guard (scrubwriter.go).
//
// The response is the call's last message and waits for the call's event: final writes it
// through the guard into the held writer below it, and the guard releases it once the call
// ended (release), or never when the event was not confirmed written (call.Release.Cut).
//
// On a session of the legacy revisions every SSE event gets an ID and is recorded (mcpsessions.Events),
// so that a sandbox whose connection broke resumes the stream with Last-Event-ID, on this
// replica or another: a GET that resumes a stream still running is attached to it (attach), and
// gets what followed its last event and then the rest, live. A dropped connection is not a
// cancellation there: the call runs on. On 2026-07-28, which has neither sessions nor
// resumption, closing the stream is the cancellation (the request's context ends).
type answer struct {
	g      *Gateway
	sid    string // the legacy session the stream is recorded under; "" records nothing
	stream string // the stream's ID in the event store
	status int    // the HTTP status of a JSON answer (200 when 0)

	mu      sync.Mutex
	w       *guardedWriter // attached writer; nil when the connection went away
	sse     bool           // the stream is an SSE stream (its head is written)
	done    chan struct{}  // closed when the response was written
	held    *bytes.Buffer  // the response, written and waiting for the call's event
	heldMsg []byte         // the response message, recorded when released
	heldID  string         // its event ID on a recorded stream
}

func newAnswer(g *Gateway, w *guardedWriter, sid string) *answer {
	a := &answer{g: g, w: w, sid: sid, done: make(chan struct{})}
	if sid != "" {
		a.stream = g.events.NewStream()
	}
	return a
}

// sseWriteTimeout bounds one write of an event to a sandbox's stream: one that reads slower
// loses the connection, not the event (legacy sessions resume with Last-Event-ID).
const sseWriteTimeout = 10 * time.Second

// event sends msg, a message of the request's stream (not its response), to the sandbox.
func (a *answer) event(msg []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := a.record(msg)
	if a.w == nil {
		return
	}
	if !a.sse {
		a.startSSE()
	}
	if err := a.w.writeEvent(id, msg, sseWriteTimeout); err != nil {
		a.g.log.Debug("sandbox stream write failed; the stream goes on without the connection", "err", err)
		a.w = nil
	}
}

// startSSE writes the head of an SSE stream.
func (a *answer) startSSE() {
	a.sse = true
	h := a.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	a.w.WriteHeader(http.StatusOK)
	a.w.Flush() // the head goes now: a client waits for it before it reads any event
}

// record records msg under the stream, returning its event ID ("" when nothing is recorded).
func (a *answer) record(msg []byte) string {
	if a.sid == "" {
		return ""
	}
	return a.g.events.Store(a.sid, a.stream, msg)
}

// final writes msg, the response, through the guard into the held writer: as the last event of
// the SSE stream, or as the JSON body when nothing came before it. sse forces a stream (a client
// that asked for one only).
func (a *answer) final(msg []byte, sse bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.heldMsg = msg
	if a.sse || sse {
		a.heldID = a.g.events.NextID(a.sid)
	}
	if a.w == nil {
		return
	}
	a.held = a.w.hold()
	if !a.sse && sse {
		a.startSSE()
	}
	if a.sse {
		_ = a.w.writeEvent(a.heldID, msg, sseWriteTimeout)
	} else {
		a.w.Header().Set("Content-Type", "application/json")
		a.w.WriteHeader(a.statusOr(http.StatusOK))
		_, _ = a.w.Write(msg)
	}
	a.w.end()
}

// release lets the held response go, unless its call's event was not written (cut: the
// connection is closed without it), and records it for a resumption.
func (a *answer) release(rel *call.Release) {
	a.mu.Lock()
	defer a.mu.Unlock()
	defer close(a.done)
	if a.heldID != "" && a.sid != "" {
		a.g.events.StoreAs(a.sid, a.stream, a.heldID, a.heldMsg)
	}
	if a.w == nil || a.held == nil || rel.Cut() {
		return
	}
	a.w.release(a.held)
}

// statusOr is the status of a JSON answer, def when none was set.
func (a *answer) statusOr(def int) int {
	if a.status != 0 {
		return a.status
	}
	return def
}

// attach makes w, a GET resuming the stream after event last, the stream's connection: what was
// recorded after last is written first, then the rest as it comes. It reports false when the
// stream already ended (its events are all recorded: the GET replays them alone).
func (a *answer) attach(w *guardedWriter, last string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.done:
		return false
	default:
	}
	a.w, a.sse = w, true
	a.startSSE()
	a.g.events.Replay(a.sid, last, func(id string, msg []byte) {
		_ = w.writeEvent(id, msg, sseWriteTimeout)
	})
	return true
}
