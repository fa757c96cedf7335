package gateway

import (
	"net/http"
	"sync"

	"github.com/sandgate/sandgate/internal/respguard"
)

// scrubWriter is the response guard (internal/respguard, shared with the proxy) on every byte
// the gateway writes to a sandbox: it wraps the writer the guard hands every request, so that
// whatever an upstream sent reaches a sandbox only through it, whatever carried it there (a
// result, a notification, a server-to-client request, an error's text, an SSE event live or
// replayed after Last-Event-ID, a stream this guard does not know yet) and whichever transport
// it came on (HTTP or stdio). A credential is overwritten in place with the marker, in every
// form respguard reads; the request's event says credential_echoed.
type scrubWriter struct {
	http.ResponseWriter
	set   *respguard.Needles
	onHit func()

	mu     sync.Mutex
	w      *respguard.Writer
	headed bool
}

func newScrubWriter(w http.ResponseWriter, set *respguard.Needles, onHit func()) *scrubWriter {
	return &scrubWriter{ResponseWriter: w, set: set, onHit: onHit}
}

// head scrubs the response header once, before it is written.
func (s *scrubWriter) head() {
	if !s.headed {
		s.headed = true
		if s.set.ScrubHeader(s.ResponseWriter.Header()) {
			s.onHit()
		}
	}
}

func (s *scrubWriter) WriteHeader(code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code >= 200 {
		s.head()
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.head()
	if s.w == nil {
		s.w = respguard.NewWriter(s.ResponseWriter, s.set, respguard.InPieces(s.ResponseWriter.Header()), s.onHit)
	}
	return s.w.Write(p)
}

// Flush sends what the guard let go; what could still begin a credential stays held.
func (s *scrubWriter) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// end writes what is still held: the response is over.
func (s *scrubWriter) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil {
		_ = s.w.End()
	}
}

func (s *scrubWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
