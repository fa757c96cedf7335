package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/mediatype"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/sse"
)

// errTruncated ends a response body the upstream cut short without an error of its own: an SSE
// stream that stopped cleanly (connection closed on a close-delimited body, an HTTP/2 stream
// ended) before its last event. ReverseProxy answers any error but io.EOF from the body by
// aborting the handler (http.ErrAbortHandler), so the sandbox's connection closes without the
// chunked terminator and the sandbox sees the cut instead of a clean end.
var errTruncated = fmt.Errorf("upstream response truncated: %w", io.ErrUnexpectedEOF)

// streamEnd follows an SSE response (with internal/sse, as the sandbox reads it) to tell a
// complete stream from one the upstream cut: complete means the stream ended after a whole
// event and, for a model API, after the event that ends a response (terminal).
//
// Where a usage parser reads the same stream (a model API's), streamEnd reads the events it
// parses (follow) instead of parsing the stream a second time: the second parse was ~1.5 µs
// of each streamed model request.
type streamEnd struct {
	model    bool
	events   sse.Parser
	shared   *sse.Parser // the usage parser's, when it follows one
	terminal bool
}

// maxEndEvent bounds the event streamEnd (or the usage parser it follows) holds; a larger one
// is skipped (never a model API's last event).
const maxEndEvent = 1 << 20

// terminalTypes and terminalData are the event types and data that end a model API's stream:
// Anthropic's message_stop (or an error event), OpenAI Chat Completions' [DONE], OpenAI
// Responses' final events.
var (
	terminalTypes = map[string]bool{"message_stop": true, "error": true, "response.completed": true,
		"response.failed": true, "response.incomplete": true}
	terminalData = [][]byte{[]byte(`{"type":"message_stop"`), []byte(`{"type":"error"`)}
)

// newStreamEnd follows a response of contentType, or returns nil when it is not SSE.
func newStreamEnd(contentType, api string) *streamEnd {
	mt, _ := mediatype.Of(contentType)
	if mt != "text/event-stream" {
		return nil
	}
	return &streamEnd{model: api != config.APINone, events: sse.Parser{Max: maxEndEvent, SkipOversized: true}}
}

// feed reads p, the next bytes of the stream; a streamEnd that follows a usage parser is
// fed by it instead.
func (e *streamEnd) feed(p []byte) {
	if e.shared != nil {
		return
	}
	_, _ = e.events.Feed(p, func(ev sse.Event) bool {
		e.see(ev)
		return true
	})
}

// see reads one event of the stream.
func (e *streamEnd) see(ev sse.Event) {
	if e.model && !e.terminal && isTerminal(ev) {
		e.terminal = true
	}
}

// follow makes e read the events u parses, when u parses the same stream as events.
func (e *streamEnd) follow(u *UsageParser) {
	if e == nil || u == nil || !u.sse {
		return
	}
	e.shared, u.end = &u.events, e
}

func isTerminal(ev sse.Event) bool {
	if terminalTypes[ev.Type] || string(ev.Data) == "[DONE]" {
		return true
	}
	for _, t := range terminalData {
		if bytes.HasPrefix(ev.Data, t) {
			return true
		}
	}
	return false
}

// complete reports whether the stream may end here.
func (e *streamEnd) complete() bool {
	events := &e.events
	if e.shared != nil {
		events = e.shared
	}
	return !events.Pending() && (!e.model || e.terminal)
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
		c.x.tooLarge.Store(errors.Is(err, respguard.ErrTooLarge))
	}
	return err
}
