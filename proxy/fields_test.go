package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

// encodeLines applies the codings of Content-Encoding lines, in order, to body.
func encodeLines(body []byte, lines []string) []byte {
	var stack []string
	for _, l := range lines {
		for c := range strings.SplitSeq(l, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" {
				stack = append(stack, c)
			}
		}
	}
	enc, _ := respguardtest.Encode(body, stack...)
	return enc
}

// prefixed is lines, each with "Name: " before it.
func prefixed(name string, lines ...string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = name + ": " + l
	}
	return out
}

// echoBody is what the upstream echoes: the key it was sent, in a JSON body.
func echoBody(r *http.Request) []byte {
	return []byte(`{"error":"bad key","x-api-key":"` + r.Header.Get("X-Api-Key") + `","n":1}`)
}

// echoStream is a model API's event stream whose text is the key it was sent.
func echoStream(r *http.Request) []byte {
	return []byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"key " + r.Header.Get("X-Api-Key") + "\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

// fieldCase is an upstream's answer that sends a field Sandgate reads as more than one line.
// refused is the code a credentialed exchange refuses it with ("" when it passes on,
// guarded).
type fieldCase struct {
	path    string
	answer  func(r *http.Request) string
	refused string
}

func codedAnswer(lines []string, contentType string, body func(*http.Request) []byte) func(*http.Request) string {
	return func(r *http.Request) string {
		return rawResponse("200 OK", append([]string{"Content-Type: " + contentType}, prefixed("Content-Encoding", lines...)...),
			encodeLines(body(r), lines))
	}
}

var fieldCases = map[string]fieldCase{
	"codings as two lines, gzip first": {path: "/ce/gzip-gzip",
		answer: codedAnswer([]string{"gzip", "gzip"}, "application/json", echoBody)},
	"codings as two lines, upper case first": {path: "/ce/GZIP-br",
		answer: codedAnswer([]string{"GZIP", "br"}, "application/json", echoBody)},
	"codings after an empty line": {path: "/ce/empty-gzip",
		answer: codedAnswer([]string{"", "gzip"}, "application/json", echoBody)},
	"codings as three lines": {path: "/ce/three",
		answer: codedAnswer([]string{"gzip", "deflate", "zstd"}, "application/json", echoBody)},
	"a list, then a line": {path: "/ce/list-line",
		answer: codedAnswer([]string{"br, gzip", "gzip"}, "application/json", echoBody)},
	"an event stream's codings as two lines": {path: "/ce/stream",
		answer: codedAnswer([]string{"gzip", "gzip"}, "text/event-stream", echoStream)},
	"a coding nobody decodes on the second line": {path: "/ce/unknown", refused: "upstream_encoding",
		answer: func(r *http.Request) string {
			return rawResponse("200 OK", []string{"Content-Encoding: gzip", "Content-Encoding: x-sandgate-unknown"}, encodeLines(echoBody(r), []string{"gzip"}))
		}},
	"a range after an empty Content-Range line": {path: "/range/empty-first", refused: "upstream_partial",
		answer: func(r *http.Request) string {
			key := r.Header.Get("X-Api-Key") + "?"
			return rawResponse("200 OK", []string{"Content-Range:", fmt.Sprintf("Content-Range: bytes 0-2/%d", len(key))}, []byte(key[:3]))
		}},
	"byte ranges without 206": {path: "/range/multipart", refused: "upstream_partial",
		answer: func(r *http.Request) string {
			key := r.Header.Get("X-Api-Key") + "?"
			body := "--x\r\nContent-Range: bytes 0-2/99\r\n\r\n" + key[:3] + "\r\n--x--\r\n"
			return rawResponse("200 OK", []string{"Content-Type: multipart/byteranges; boundary=x"}, []byte(body))
		}},
	"media types that disagree": {path: "/ct/disagree", refused: "upstream_error",
		answer: func(r *http.Request) string {
			return rawResponse("200 OK", []string{"Content-Type: application/json", "Content-Type: text/event-stream"}, echoStream(r))
		}},
	"trailers announced on two lines": {path: "/trailer/two-lines",
		answer: func(r *http.Request) string {
			return rawResponse("200 OK", []string{"Trailer: X-Checksum", "Trailer: X-Echo", "Transfer-Encoding: chunked"},
				chunkedWithTrailer([]byte("ok"), []string{"X-Checksum: 1", "X-Echo: " + r.Header.Get("X-Api-Key")}))
		}},
	"a trailer named after the key": {path: "/trailer/named",
		answer: func(r *http.Request) string {
			key := r.Header.Get("X-Api-Key")
			return rawResponse("200 OK", []string{"Trailer: X-Checksum, " + key, "Transfer-Encoding: chunked"},
				chunkedWithTrailer([]byte("ok"), []string{"X-Checksum: 1", key + ": 1"}))
		}},
	"a field named after the key": {path: "/header/named",
		answer: func(r *http.Request) string {
			return rawResponse("200 OK", []string{"X-" + r.Header.Get("X-Api-Key") + ": 1", "Content-Type: text/plain"}, []byte("ok"))
		}},
	"lengths on two lines that agree": {path: "/length/agree",
		answer: func(r *http.Request) string {
			b := echoBody(r)
			return rawResponse("200 OK", prefixed("Content-Length", fmt.Sprint(len(b)), fmt.Sprint(len(b))), b)
		}},
}

// sandboxReadsKey reports whether anything the sandbox got holds the key, as its client reads
// it: the body decoded by every Content-Encoding line it came with, and every field's name and
// value, head and trailer, without regard to case.
func sandboxReadsKey(t *testing.T, f fetched) bool {
	t.Helper()
	body := []byte(f.body)
	if ce := f.final.Header.Values("Content-Encoding"); len(ce) > 0 {
		resp := &http.Response{Header: http.Header{"Content-Encoding": ce}, Body: io.NopCloser(bytes.NewReader(body))}
		if respguard.Decode(resp) == nil {
			body, _ = io.ReadAll(resp.Body)
		}
	}
	if respguard.Build([]string{realKey}, nil).Betrays(body) {
		return true
	}
	lower := strings.ToLower(realKey)
	for _, h := range []http.Header{f.final.Header, f.final.Trailer} {
		for k, vs := range h {
			if strings.Contains(strings.ToLower(k+": "+strings.Join(vs, ",")), lower) {
				return true
			}
		}
	}
	return false
}

// TestEveryLineOfAResponseFieldIsRead (issue 59, class 1): an upstream writes the fields
// Sandgate reads to guard a response (codings, ranges, media type, trailers announced, lengths,
// names) as several lines on its connection. Through every credentialed way (base-URL routes
// with and without a model API, an intercepted model API) the response is either passed on
// guarded, every layer decoded and scanned, or refused with its code; and it is audited so.
func TestEveryLineOfAResponseFieldIsRead(t *testing.T) {
	answers := map[string]func(*http.Request) string{}
	for _, c := range fieldCases {
		answers[c.path] = c.answer
	}
	rh := newRawHarness(t, answers)
	for _, way := range via[:3] {
		for name, c := range fieldCases {
			t.Run(way+": "+name, func(t *testing.T) {
				f := rh.get(t, way, c.path)
				assert.False(t, sandboxReadsKey(t, f), "the key reached the sandbox: %q", f.raw)
				ev := rh.rec.waitFor(t, func(e audit.Event) bool {
					return e.Kind == audit.KindHTTPRequest && e.Target.Path == c.path && e.Target.Route == route(way)
				})
				if c.refused != "" {
					assert.Equal(t, http.StatusBadGateway, f.final.StatusCode)
					assert.Equal(t, c.refused, ev.Outcome.Error)
					return
				}
				require.Equal(t, http.StatusOK, f.final.StatusCode, "%q", f.raw)
				assert.NoError(t, f.bodyErr)
				assert.Empty(t, f.final.Header.Values("Content-Encoding"), "passed on decoded")
				assert.Empty(t, ev.Outcome.Error)
				assert.True(t, ev.Outcome.CredentialEchoed, "the echo was found")
				if strings.HasPrefix(c.path, "/ce/stream") && way != "route without API" {
					assert.Equal(t, [2]int64{7, 9}, [2]int64{ev.Outcome.TokensIn, ev.Outcome.TokensOut}, "usage read from the decoded stream")
				}
			})
		}
	}
}

// TestForwardedCodingsArriveAsSent: a plain forward carries no credential and Sandgate does
// not read its body, so the sandbox gets the upstream's response as sent, every coding line
// and every layer: the transport decodes nothing Sandgate does not see.
func TestForwardedCodingsArriveAsSent(t *testing.T) {
	plain := []byte(`{"hello":"world"}`)
	splits := map[string][]string{"/f/gzip-gzip": {"gzip", "gzip"}, "/f/gzip-br": {"gzip", "br"}, "/f/GZIP-zstd": {"GZIP", "zstd"}}
	answers := map[string]func(*http.Request) string{}
	for path, lines := range splits {
		answers[path] = codedAnswer(lines, "application/json", func(*http.Request) []byte { return plain })
	}
	rh := newRawHarness(t, answers)
	for path, lines := range splits {
		t.Run(path, func(t *testing.T) {
			f := rh.get(t, "forward", path)
			require.Equal(t, http.StatusOK, f.final.StatusCode)
			assert.Equal(t, lines, f.final.Header.Values("Content-Encoding"), "every line as sent")
			assert.Equal(t, encodeLines(plain, lines), []byte(f.body), "every layer as sent")
		})
	}
}
