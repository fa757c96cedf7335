// Package sse is the one reader of server-sent event streams in Sandgate: the gateway's
// upstream MCP streams, the proxy's model-API streams (usage, the end of a stream) and the
// response guard's view of a stream all parse with it, so that every part of Sandgate splits
// lines, fields and events the same way, and the way a browser does.
//
// It follows the event-stream interpretation of the HTML standard
// (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):
// lines end with CRLF, LF or CR; one leading byte order mark is ignored; a line starting with a
// colon is a comment; "field: value" loses one space after the colon; data lines are joined
// with LF; an id containing NUL is ignored; retry is ASCII digits only; a blank line dispatches
// the event, if it has data; an event the stream ends inside is never dispatched.
//
// Unlike a browser it is bounded: Max caps the bytes of one event (its lines, terminators
// included), and an event over it is either an error (ErrTooLarge) or, with SkipOversized,
// dropped. Bytes are passed as they are: no UTF-8 decoding (the data's consumer validates it).
package sse

import (
	"bytes"
	"errors"
	"io"
	"strconv"
)

// ErrTooLarge is an event larger than the parser's Max.
var ErrTooLarge = errors.New("sse: event larger than the limit")

// Event is one dispatched event.
type Event struct {
	// Type is the event field, "" when the event had none (a browser calls it "message").
	Type string
	// Data is the data lines joined with LF. It is only valid until the parser reads on.
	Data []byte
	// ID is the last event ID as of this event (it carries over from earlier events).
	ID string
	// Retry is the reconnection time in milliseconds the stream last set, -1 if none.
	Retry int64
	// End is the offset in the fed chunk just after the line terminator that dispatched the
	// event (Feed only).
	End int
}

// Parser is a push parser: Feed it the stream's bytes in any pieces. The zero value is ready
// and unbounded; set Max before the first Feed.
type Parser struct {
	// Max bounds one event in bytes (0: no bound).
	Max int
	// SkipOversized drops an event over Max (and counts it in Skipped) instead of failing.
	SkipOversized bool
	// Skipped counts the events dropped for their size.
	Skipped int
	// CountOnly keeps no data: events are dispatched empty (for a reader that bounds a stream
	// another reader parses).
	CountOnly bool

	started  bool // past the byte order mark check
	bom      int  // bytes of a leading byte order mark matched so far
	afterCR  bool // the last byte was a CR: an LF next is part of that terminator
	line     []byte
	lineN    int  // bytes of the current line, kept in line unless over
	size     int  // bytes of the current event so far
	over     bool // the current event went over Max (skipping)
	pending  bool // a line (even a comment) was read since the last blank line
	data     []byte
	hasData  bool
	typ      []byte
	lastType string // the last event's type, reused while the type repeats
	lastID   string
	retry    int64
	retrySet bool
	err      error
}

var bom = []byte("\xef\xbb\xbf")

// Feed parses p and calls emit with each event dispatched in it, in order, until emit
// returns false. It returns the number of bytes consumed: len(p) unless emit stopped it
// (then the offset just after the dispatching line) or an error (ErrTooLarge) occurred.
func (ps *Parser) Feed(p []byte, emit func(Event) bool) (int, error) {
	if ps.err != nil {
		return 0, ps.err
	}
	off := 0
	if !ps.started {
		for off < len(p) && ps.bom < len(bom) && p[off] == bom[ps.bom] {
			off++
			ps.bom++
		}
		if off == len(p) && ps.bom < len(bom) {
			return len(p), nil // could still be a byte order mark
		}
		ps.started = true
		if ps.bom < len(bom) && ps.bom > 0 {
			// A partial mark is data of the first line.
			ps.line = append(ps.line, bom[:ps.bom]...)
			ps.lineN += ps.bom
			ps.size += ps.bom
			ps.pending = true
		}
	}
	for off < len(p) {
		if ps.afterCR {
			ps.afterCR = false
			if p[off] == '\n' {
				off++
				continue
			}
		}
		i := lineEnd(p[off:])
		if i < 0 {
			if err := ps.grow(len(p) - off); err != nil {
				return off, err
			}
			if !ps.over {
				ps.line = append(ps.line, p[off:]...)
			}
			ps.lineN += len(p) - off
			ps.pending = true
			return len(p), nil
		}
		if err := ps.grow(i + 1); err != nil {
			return off, err
		}
		// A line that began in an earlier Feed is joined in ps.line; one that is whole in
		// p is read where it is.
		line, n := p[off:off+i], ps.lineN+i
		if ps.lineN > 0 {
			if !ps.over {
				ps.line = append(ps.line, line...)
			}
			line = ps.line
		}
		ps.line, ps.lineN = ps.line[:0], 0
		if p[off+i] == '\r' {
			ps.afterCR = true
		}
		off += i + 1
		ev, ok := ps.endLine(line, n)
		if ok {
			ev.End = off
			if !emit(ev) {
				return off, nil
			}
		}
	}
	return off, nil
}

// lineEnd is the index of the first CR or LF in b, or -1. LF ends most lines; CR is looked
// for only before it (two vectorised searches instead of a byte loop).
func lineEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		i = len(b)
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	if i == len(b) {
		return -1
	}
	return i
}

// grow counts n more bytes of the current event against Max.
func (ps *Parser) grow(n int) error {
	ps.size += n
	if ps.Max <= 0 || ps.size <= ps.Max || ps.over {
		return nil
	}
	if !ps.SkipOversized {
		ps.err = ErrTooLarge
		return ps.err
	}
	ps.over = true
	ps.line, ps.data, ps.typ, ps.hasData = ps.line[:0], ps.data[:0], ps.typ[:0], false
	return nil
}

// endLine interprets a line of n bytes (line holds them unless the event is over Max); a blank
// line dispatches.
func (ps *Parser) endLine(line []byte, n int) (Event, bool) {
	if n > 0 {
		ps.pending = true
		if !ps.over {
			ps.field(line)
		}
		return Event{}, false
	}
	return ps.dispatch()
}

func (ps *Parser) field(line []byte) {
	if line[0] == ':' {
		return
	}
	name, value, found := bytes.Cut(line, []byte(":"))
	if found && len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	switch string(name) {
	case "event":
		ps.typ = append(ps.typ[:0], value...)
	case "data":
		if !ps.CountOnly {
			ps.data = append(append(ps.data, value...), '\n')
		}
		ps.hasData = true
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			ps.lastID = string(value)
		}
	case "retry":
		if n, ok := digits(value); ok {
			ps.retry, ps.retrySet = n, true
		}
	}
}

// digits is value as a number when it is ASCII digits only (and fits).
func digits(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}

// dispatch ends the event at a blank line.
func (ps *Parser) dispatch() (Event, bool) {
	over := ps.over
	ps.size, ps.over, ps.pending = 0, false, false
	if over {
		ps.Skipped++
		ps.data, ps.typ, ps.hasData = ps.data[:0], ps.typ[:0], false
		return Event{}, false
	}
	if !ps.hasData {
		ps.typ = ps.typ[:0]
		return Event{}, false
	}
	if string(ps.typ) != ps.lastType { // a stream's events mostly repeat a few types
		ps.lastType = string(ps.typ)
	}
	ev := Event{Type: ps.lastType, ID: ps.lastID, Retry: -1}
	if len(ps.data) > 0 {
		ev.Data = ps.data[:len(ps.data)-1]
	}
	if ps.retrySet {
		ev.Retry = ps.retry
	}
	ps.data, ps.typ, ps.hasData = ps.data[:0], ps.typ[:0], false
	return ev, true
}

// End is the stream's end for a lenient reader: the event the stream ended inside, if it has
// data, is dispatched as if a blank line had followed (the standard discards it; a reader of an
// upstream that omits the last blank line may prefer not to).
func (ps *Parser) End(emit func(Event) bool) {
	if ps.err != nil || ps.over {
		return
	}
	if ps.lineN > 0 {
		ps.field(ps.line)
		ps.line, ps.lineN = ps.line[:0], 0
	}
	if ev, ok := ps.dispatch(); ok {
		emit(ev)
	}
}

// Pending reports whether the stream is inside an event: some line (a comment included) was
// read, or begun, since the last blank line. A stream that ends here ends inside an event.
func (ps *Parser) Pending() bool { return ps.pending || ps.lineN > 0 }

// Reader reads events from an io.Reader.
type Reader struct {
	// Lenient returns, at the end of the stream, the event the stream ended inside (Parser.End).
	Lenient bool
	ended   bool
	r       io.Reader
	ps      Parser
	buf     []byte
	start   int // unparsed bytes are buf[start:end]
	end     int
	err     error
}

// NewReader reads events from r, each at most max bytes (0: no bound; an event over it is
// ErrTooLarge).
func NewReader(r io.Reader, max int) *Reader {
	return &Reader{r: r, ps: Parser{Max: max}, buf: make([]byte, 4096)}
}

// Next returns the next event. At the end of the stream it returns io.EOF: an event the
// stream ended inside is not returned. Event.Data is valid until the next call.
func (rd *Reader) Next() (Event, error) {
	for {
		if rd.start < rd.end {
			var ev Event
			got := false
			n, err := rd.ps.Feed(rd.buf[rd.start:rd.end], func(e Event) bool {
				ev, got = e, true
				return false
			})
			rd.start += n
			if err != nil {
				rd.err = err
				return Event{}, err
			}
			if got {
				ev.End = 0
				return ev, nil
			}
		}
		if rd.err == io.EOF && rd.Lenient && !rd.ended {
			rd.ended = true
			var ev Event
			got := false
			rd.ps.End(func(e Event) bool { ev, got = e, true; return false })
			if got {
				return ev, nil
			}
		}
		if rd.err != nil {
			return Event{}, rd.err
		}
		n, err := rd.r.Read(rd.buf)
		rd.start, rd.end = 0, n
		if err != nil {
			rd.err = err
		}
	}
}
