package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"

	"github.com/sandgate/sandgate/internal/config"
)

// errTruncated ends a response body the upstream cut short without an error of its own: an SSE
// stream that stopped cleanly (connection closed on a close-delimited body, an HTTP/2 stream
// ended) before its last event. ReverseProxy answers any error but io.EOF from the body by
// aborting the handler (http.ErrAbortHandler), so the sandbox's connection closes without the
// chunked terminator and the sandbox sees the cut instead of a clean end.
var errTruncated = fmt.Errorf("upstream response truncated: %w", io.ErrUnexpectedEOF)

// streamEnd follows an SSE response line by line to tell a complete stream from one the
// upstream cut: complete means the stream ended after a whole event and, for a model API, after
// the event that ends a response (terminalSSE). It keeps the first bytes of one line only.
type streamEnd struct {
	model    bool
	line     [48]byte
	n        int  // length of the current line (the first len(line) bytes kept)
	inEvent  bool // a field line was read since the last blank line
	terminal bool
}

// terminalSSE are the event names and data lines that end a model API's stream: Anthropic's
// message_stop (or an error event), OpenAI Chat Completions' [DONE], OpenAI Responses' final
// events.
var terminalSSE = [][]byte{
	[]byte("event: message_stop"), []byte("event: error"), []byte("event: response.completed"),
	[]byte("event: response.failed"), []byte("event: response.incomplete"), []byte("data: [DONE]"),
	[]byte(`data: {"type":"message_stop"`), []byte(`data: {"type":"error"`),
}

// newStreamEnd follows a response of contentType, or returns nil when it is not SSE.
func newStreamEnd(contentType, api string) *streamEnd {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt != "text/event-stream" {
		return nil
	}
	return &streamEnd{model: api != config.APINone}
}

// feed reads p, the next bytes of the stream.
func (e *streamEnd) feed(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		seg := p
		if i >= 0 {
			seg = p[:i]
		}
		if e.n < len(e.line) {
			copy(e.line[e.n:], seg)
		}
		e.n += len(seg)
		if i < 0 {
			return
		}
		e.endLine()
		p = p[i+1:]
	}
}

func (e *streamEnd) endLine() {
	l := e.line[:min(e.n, len(e.line))]
	if e.n <= len(e.line) {
		l = bytes.TrimSuffix(l, []byte("\r"))
	}
	e.n = 0
	if len(l) == 0 {
		e.inEvent = false
		return
	}
	e.inEvent = true
	if !e.model || e.terminal {
		return
	}
	// "event:message_stop" is the same field as "event: message_stop".
	if f, v, ok := bytes.Cut(l, []byte(":")); ok && (len(v) == 0 || v[0] != ' ') {
		l = append(append(append([]byte(nil), f...), ':', ' '), v...)
	}
	for _, t := range terminalSSE {
		if bytes.HasPrefix(l, t) && (len(l) == len(t) || t[len(t)-1] == '"') {
			e.terminal = true
			return
		}
	}
}

// complete reports whether the stream may end here.
func (e *streamEnd) complete() bool {
	return e.n == 0 && !e.inEvent && (!e.model || e.terminal)
}

// upstreamEnd judges how the upstream's body ended. A read error is the upstream's, unless the
// sandbox went away (the request's context is done); a clean end of an SSE stream that is not
// complete is a truncation, reported as errTruncated so ReverseProxy aborts the response.
func (c *countingBody) upstreamEnd(err error) error {
	if err == io.EOF {
		if c.end == nil || c.end.complete() {
			return err
		}
		c.x.truncated.Store(true)
		return errTruncated
	}
	if c.ctx.Err() == nil && !errors.Is(err, errTruncated) {
		c.x.truncated.Store(true)
	}
	return err
}
