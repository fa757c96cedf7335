package gateway

import (
	"log/slog"
	"net/http"
	"sync"
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
	store *eventStore
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

func newSandboxStream(store *eventStore, sid string, log *slog.Logger) *sandboxStream {
	return &sandboxStream{store: store, sid: sid, log: log}
}

// deliver records msg, one JSON-RPC message, and sends it to the attached connection.
func (st *sandboxStream) deliver(msg []byte) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	id := st.store.store(st.sid, listenStream, msg)
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
		st.store.replay(st.sid, lastID, func(id string, msg []byte) {
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
