package respguard

import (
	"errors"
	"net/http"
	"strings"

	"github.com/sandgate/sandgate/internal/mediatype"
)

// The response fields that decide how a body is guarded are read from all of their lines. An
// upstream may send a field as several lines (RFC 9110 §5.3 lets a list be split so, and
// nothing stops it doing so for a field that is not one), and a reader of the first line alone
// (http.Header.Get) guards another response than the one the sandbox's client reads:
//
//   - Content-Encoding: every line's codings, in order (Decode);
//   - Content-Range: present on any line, even empty, makes a partial response (Partial);
//   - Content-Type: read in pieces when any line names JSON or an event stream (InPieces);
//     a single media type where Sandgate reads the body by it, refused when the lines
//     disagree (MediaType);
//   - Trailer and Content-Length, Transfer-Encoding: net/http's transport reads every line
//     (trailers announced on any line are in Response.Trailer; lengths that differ and
//     several transfer codings are errors), and a field's name is scrubbed as its value is
//     (ScrubHeader).

// ErrFields is a response whose lines of one field name different things where Sandgate reads
// that field to guard the body: it cannot tell which the sandbox's client will read.
var ErrFields = errors.New("a response field whose lines disagree")

// MediaType is the media type of h's Content-Type, read from all of its lines: "" without one,
// ErrFields when the lines name different types (or one does not parse where another does).
func MediaType(h http.Header) (string, error) {
	vs := h.Values("Content-Type")
	if len(vs) == 0 {
		return "", nil
	}
	first, _ := mediatype.Of(vs[0])
	for _, v := range vs[1:] {
		if mt, _ := mediatype.Of(v); mt != first {
			return "", ErrFields
		}
	}
	return first, nil
}

// InPieces reports whether a body with these fields is read in pieces too: the strings of a
// JSON text joined as a sandbox joins them (the content parts of a result, the items of an
// array, the deltas of an event stream). A body is when any line of its Content-Type names
// JSON (application/json, application/*+json, JSON lines and sequences) or an event stream.
func InPieces(h http.Header) bool {
	for _, v := range h.Values("Content-Type") {
		mt, _ := mediatype.Of(v)
		switch {
		case mt == "text/event-stream", mt == "application/json", mt == "application/x-ndjson",
			mt == "application/jsonl", mt == "application/json-seq",
			strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"):
			return true
		}
	}
	return false
}

// Partial reports whether resp is a part of a representation: status 206, a Content-Range on
// any line (an empty first line hides the rest from Header.Get), or a multipart/byteranges
// body on any Content-Type line.
func Partial(resp *http.Response) bool {
	if resp.StatusCode == http.StatusPartialContent || len(resp.Header.Values("Content-Range")) > 0 {
		return true
	}
	for _, v := range resp.Header.Values("Content-Type") {
		if mt, _ := mediatype.Of(v); mt == "multipart/byteranges" {
			return true
		}
	}
	return false
}
