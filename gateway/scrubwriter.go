package gateway

import (
	"bytes"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/respguard"
)

// guardedWriter is how the gateway writes to a sandbox: every byte goes through the response
// guard (internal/respguard, shared with the proxy), whatever carried it there (a result, a
// notification, a server-to-client request, an error's text, an SSE event live or replayed
// after Last-Event-ID) and whichever transport it came on (HTTP or stdio). A credential is
// overwritten in place with the marker, in every form respguard reads; onHit notes it on the
// request's call. Below the guard, the bytes are counted and, from hold on, held back until
// release: the response waits there for its call's event (answer.go).
type guardedWriter struct {
	http.ResponseWriter
	set   *respguard.Needles
	onHit func()
	n     *atomic.Int64 // bytes written to the sandbox

	mu     sync.Mutex
	w      *respguard.Writer
	sink   heldSink
	headed bool
	code   int
}

func newGuardedWriter(w http.ResponseWriter, set *respguard.Needles, n *atomic.Int64, onHit func()) *guardedWriter {
	g := &guardedWriter{ResponseWriter: w, set: set, onHit: onHit, n: n}
	g.sink.w = w
	g.sink.n = n
	return g
}

// counts makes n the count of the bytes written from now on.
func (g *guardedWriter) counts(n *atomic.Int64) {
	g.mu.Lock()
	g.n, g.sink.n = n, n
	g.mu.Unlock()
}

// head scrubs the response header once, before it is written.
func (g *guardedWriter) head() {
	if !g.headed {
		g.headed = true
		if g.set.ScrubHeader(g.ResponseWriter.Header()) {
			g.onHit()
		}
	}
}

func (g *guardedWriter) WriteHeader(code int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.code != 0 {
		return
	}
	g.code = code
	g.head()
	g.ResponseWriter.WriteHeader(code)
}

func (g *guardedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.code == 0 {
		g.code = http.StatusOK
		g.head()
	}
	if g.w == nil {
		g.w = respguard.NewWriter(&g.sink, g.set, respguard.InPieces(g.ResponseWriter.Header()), g.onHit)
	}
	return g.w.Write(p)
}

// writeEvent writes one SSE event carrying msg (with id, when set) and flushes it, within
// timeout.
func (g *guardedWriter) writeEvent(id string, msg []byte, timeout time.Duration) error {
	rc := http.NewResponseController(g.ResponseWriter)
	_ = rc.SetWriteDeadline(time.Now().Add(timeout))
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	if _, err := g.Write(sseEvent(id, msg)); err != nil {
		return err
	}
	return g.flush()
}

// flush sends what the guard let go; what could still begin a credential stays held.
func (g *guardedWriter) flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sink.held != nil {
		return nil
	}
	return http.NewResponseController(g.ResponseWriter).Flush()
}

// Flush sends what the guard let go (http.Flusher).
func (g *guardedWriter) Flush() { _ = g.flush() }

// end writes what the guard still holds: the response is over.
func (g *guardedWriter) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w != nil {
		_ = g.w.End()
	}
}

// hold makes the writes below the guard wait in the returned buffer until release.
func (g *guardedWriter) hold() *bytes.Buffer {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sink.held = &bytes.Buffer{}
	return g.sink.held
}

// release writes what hold kept back, and flushes it.
func (g *guardedWriter) release(b *bytes.Buffer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sink.held = nil
	if b.Len() > 0 {
		_, _ = g.ResponseWriter.Write(b.Bytes())
	}
	_ = http.NewResponseController(g.ResponseWriter).Flush()
}

func (g *guardedWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// heldSink is what lies below the guard: the connection's writer, counted, or a buffer while
// the response is held.
type heldSink struct {
	w    http.ResponseWriter
	n    *atomic.Int64
	held *bytes.Buffer
}

func (s *heldSink) Write(p []byte) (int, error) {
	s.n.Add(int64(len(p)))
	if s.held != nil {
		return s.held.Write(p)
	}
	return s.w.Write(p)
}

// sseEvent is one SSE event carrying data, with id when set. Data holding line breaks (an
// upstream's pretty-printed JSON) is split into data lines, which a reader joins back with LF.
func sseEvent(id string, data []byte) []byte {
	b := make([]byte, 0, len(data)+len(id)+32)
	if id != "" {
		b = append(append(append(b, "id: "...), id...), '\n')
	}
	b = append(b, "event: message\n"...)
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		b = append(append(append(b, "data: "...), data[:i]...), '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b = append(append(append(b, "data: "...), data...), '\n')
	return append(b, '\n')
}
