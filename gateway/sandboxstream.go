package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/mcpsessions"
)

// listenStream is the stream ID, in the event store, of every sandbox session's GET stream.
const listenStream = "sg-listen"

// streamBuffer bounds the events waiting to be written to one sandbox's GET connection. A
// sandbox that reads slower loses the connection, not the events: they are recorded, and it
// resumes with Last-Event-ID.
const streamBuffer = 64

// sandboxStream is a sandbox session's GET stream, which the gateway serves itself: what an
// upstream sends outside a call (notifications, requests to the client) and what the gateway
// tells the sandbox (its lists changed) is recorded in the event store under listenStream and
// written to the GET connection attached, if any. A GET with a Last-Event-ID of this stream
// gets what followed that event and then the live stream; a new GET supersedes the one before,
// as in mcp-go. Recording and attaching are serialized (mu), so an event reaches a connection
// either in its replay or live, never both and never neither.
type sandboxStream struct {
	store *mcpsessions.Events
	sid   string
	log   *slog.Logger

	mu     sync.Mutex
	conn   *streamConn
	closed bool
}

// streamConn is one attached GET connection.
type streamConn struct {
	events chan []byte // framed SSE events
	gone   chan struct{}
	once   sync.Once
}

func (c *streamConn) end() { c.once.Do(func() { close(c.gone) }) }

func newSandboxStream(store *mcpsessions.Events, sid string, log *slog.Logger) *sandboxStream {
	return &sandboxStream{store: store, sid: sid, log: log}
}

// deliver records msg, one JSON-RPC message, and sends it to the attached connection.
func (st *sandboxStream) deliver(msg []byte) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	id := st.store.Store(st.sid, listenStream, msg)
	if st.conn == nil {
		return
	}
	select {
	case st.conn.events <- sseEvent(id, msg):
	default:
		st.log.Info("sandbox reads its GET stream too slowly; closed, it resumes with Last-Event-ID", "session", st.sid)
		st.conn.end()
		st.conn = nil
	}
}

// attach makes a new connection the stream's, superseding the one before; with lastID, what
// was recorded after that event is its first events.
func (st *sandboxStream) attach(lastID string) *streamConn {
	st.mu.Lock()
	defer st.mu.Unlock()
	var replay [][]byte
	if lastID != "" {
		st.store.Replay(st.sid, lastID, func(id string, msg []byte) {
			replay = append(replay, sseEvent(id, msg))
		})
	}
	c := &streamConn{events: make(chan []byte, len(replay)+streamBuffer), gone: make(chan struct{})}
	for _, ev := range replay {
		c.events <- ev
	}
	if st.conn != nil {
		st.conn.end()
	}
	st.conn = c
	if st.closed {
		c.end()
	}
	return c
}

func (st *sandboxStream) detach(c *streamConn) {
	st.mu.Lock()
	if st.conn == c {
		st.conn = nil
	}
	st.mu.Unlock()
	c.end()
}

// close ends the stream with its session.
func (st *sandboxStream) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	if st.conn != nil {
		st.conn.end()
		st.conn = nil
	}
}

// serve writes the stream to w until the sandbox goes away, another GET takes the stream over
// or the session ends.
func (st *sandboxStream) serve(w http.ResponseWriter, r *http.Request, lastID string) {
	c := st.attach(lastID)
	defer st.detach(c)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush(w)
	for {
		select {
		case ev := <-c.events:
			if _, err := w.Write(ev); err != nil {
				return
			}
			flush(w)
		case <-c.gone:
			return
		case <-r.Context().Done():
			return
		}
	}
}

func flush(w http.ResponseWriter) {
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// A GET to /mcp (revisions before 2026-07-28) is the session's stream: its standalone stream
// (sandboxstream.go), where what an upstream sends outside a call goes, or, with a
// Last-Event-ID of a call's stream, that stream resumed (answer.go): what followed that event,
// and then the rest of the call as it comes, its result included. 2026-07-28 has no GET stream
// (405); its list changes and resource updates go to subscriptions/listen (listen.go).

// askStream checks a GET: a session of the caller's, on a revision that has one.
func (x *exchange) askStream() (call.Question, *call.Refusal) {
	if modernRequest(x.r) {
		return call.Question{}, call.Refuse(call.CodeMalformedRequest, "GET has no stream on protocol %s; use subscriptions/listen",
			mcp.ProtocolVersion20260728)
	}
	return call.Question{}, x.session0(true)
}

// serveStream serves the session's stream until the sandbox goes away, another GET takes it
// over, the session ends or, for the standalone stream, the listener drains.
func (x *exchange) serveStream(ctx context.Context) (response, call.End) {
	last := x.r.Header.Get("Last-Event-ID")
	if last == "" {
		return x.serveStandalone(ctx, "")
	}
	stream, ok := x.g.events.StreamOf(ctx, x.sid, last)
	switch {
	case !ok:
		rf := call.Refuse(call.CodeBadParams, "unknown Last-Event-ID; send the request again")
		return x.refuseHTTP(rf, nil), call.Denied(rf)
	case stream == listenStream:
		return x.serveStandalone(ctx, last)
	}
	if a := x.session.call(stream); a != nil && a.attach(x.w, last) {
		select { // the call's stream is this GET's until it ends
		case <-a.done:
		case <-ctx.Done():
		case <-x.session.ctx.Done():
		}
		return response{}, call.Answered(http.StatusOK)
	}
	x.out.mu.Lock()
	x.out.startSSE()
	x.out.mu.Unlock()
	x.g.events.Replay(x.sid, last, func(id string, msg []byte) { _ = x.w.writeEvent(id, msg, sseWriteTimeout) })
	return response{}, call.Answered(http.StatusOK)
}

// serveStandalone serves the session's standalone stream: it ends when the listener starts
// draining (it is no call waiting for an answer).
func (x *exchange) serveStandalone(ctx context.Context, last string) (response, call.End) {
	ctx, end := context.WithCancel(ctx)
	defer end()
	defer context.AfterFunc(x.g.streams, end)()
	x.session.stream.serve(x.w, x.r.WithContext(ctx), last)
	return response{}, call.Answered(http.StatusOK)
}
