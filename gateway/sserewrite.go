package gateway

import (
	"bytes"
	"io"

	"github.com/sandgate/sandgate/internal/sse"
)

// The gateway rewrites some SSE events on their way to a sandbox (a result's extra fields, a
// relayed message, an event as the store recorded it). Streams are read with internal/sse, the
// project's one SSE reader, and events are written with sseEvent.

// sseEvent is one SSE event carrying data, with id and typ when they are set. Data holding
// line breaks (an upstream's pretty-printed JSON) is split into data lines, which a reader
// joins back with LF.
func sseEvent(id string, data []byte) []byte { return appendSSEEvent(nil, id, "message", data) }

func appendSSEEvent(b []byte, id, typ string, data []byte) []byte {
	if id != "" {
		b = append(append(append(b, "id: "...), id...), '\n')
	}
	if typ != "" {
		b = append(append(append(b, "event: "...), typ...), '\n')
	}
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

// eventRewriter passes an SSE stream written to it on to w; an event for which rewrite returns
// new data is written with that data instead (same ID and type), every other byte as written.
// The bytes of an event are held until the event ends (its blank line), so a rewrite sees the
// whole event whatever pieces it was written in.
type eventRewriter struct {
	w       io.Writer
	rewrite func(ev sse.Event) ([]byte, bool)
	ps      sse.Parser
	held    []byte
}

func (e *eventRewriter) Write(p []byte) (int, error) {
	start := 0
	var werr error
	_, err := e.ps.Feed(p, func(ev sse.Event) bool {
		block := p[start:ev.End]
		if len(e.held) > 0 {
			block = append(e.held, block...)
			e.held = e.held[:0]
		}
		if data, ok := e.rewrite(ev); ok {
			block = appendSSEEvent(nil, ev.ID, ev.Type, data)
		}
		start = ev.End
		_, werr = e.w.Write(block)
		return werr == nil
	})
	switch {
	case werr != nil:
		return 0, werr
	case err != nil: // not an event stream after all: passed on as it is
		_, werr = e.w.Write(append(e.held, p[start:]...))
		e.held = e.held[:0]
		return len(p), werr
	}
	e.held = append(e.held, p[start:]...)
	return len(p), nil
}

// end writes what is held: the stream is over.
func (e *eventRewriter) end() error {
	if len(e.held) == 0 {
		return nil
	}
	_, err := e.w.Write(e.held)
	e.held = nil
	return err
}

// rewriteEvents is body, a whole SSE stream, with rewrite applied to each event.
func rewriteEvents(body []byte, rewrite func(ev sse.Event) ([]byte, bool)) []byte {
	var out bytes.Buffer
	e := &eventRewriter{w: &out, rewrite: rewrite}
	_, _ = e.Write(body)
	_ = e.end()
	return out.Bytes()
}
