package respguard_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/mediatype"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

// lineSplits are ways an upstream writes one Content-Encoding as several lines: each entry is
// the lines, in order, of a stack of codings applied in that order.
var lineSplits = map[string][]string{
	"two lines":                 {"gzip", "gzip"},
	"two lines, second br":      {"gzip", "br"},
	"first line upper case":     {"GZIP", "zstd"},
	"empty first line":          {"", "gzip"},
	"empty line between":        {"br", "", "gzip"},
	"a list and a line":         {"deflate, gzip", "br"},
	"identity line first":       {"identity", "gzip", "gzip"},
	"three lines":               {"gzip", "deflate", "zstd"},
	"trailing comma then line":  {"gzip,", "br"},
	"white space around values": {" gzip ", "\tbr"},
}

// encodeLines applies the codings of lines (in order) to body.
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

func TestDecodeReadsEveryLineOfContentEncoding(t *testing.T) {
	body := []byte(`{"echo":"` + secret + `"}`)
	for name, lines := range lineSplits {
		t.Run(name, func(t *testing.T) {
			resp := &http.Response{Header: http.Header{"Content-Encoding": lines},
				Body: io.NopCloser(bytes.NewReader(encodeLines(body, lines)))}
			require.NoError(t, respguard.Decode(resp))
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, body, got)
			assert.Empty(t, resp.Header.Values("Content-Encoding"), "no line is left")
		})
	}
	t.Run("an unknown coding on a later line is refused, and not named", func(t *testing.T) {
		resp := &http.Response{Header: http.Header{"Content-Encoding": {"gzip", secret}}, Body: io.NopCloser(strings.NewReader("x"))}
		err := respguard.Decode(resp)
		require.ErrorIs(t, err, respguard.ErrEncoding)
		assert.NotContains(t, strings.ToLower(err.Error()), strings.ToLower(secret), "the upstream's words stay out of the error")
	})
	t.Run("a body the transport decoded is refused", func(t *testing.T) {
		resp := &http.Response{Header: http.Header{}, Uncompressed: true, Body: io.NopCloser(strings.NewReader("x"))}
		assert.ErrorIs(t, respguard.Decode(resp), respguard.ErrEncoding)
	})
}

// TestATransportThatDecodesIsCaught runs net/http's transport as it comes (it asks for gzip
// and decodes a body whose first Content-Encoding line says gzip) against an upstream that
// writes its codings as two lines on a raw connection: the layer the transport took off is
// not one Decode saw, so the response is refused. With DisableCompression, every layer is
// Decode's and the body comes out whole.
func TestATransportThatDecodesIsCaught(t *testing.T) {
	body := []byte(`{"echo":"` + secret + `"}`)
	enc := encodeLines(body, []string{"gzip", "gzip"})
	addr := rawServer(t, func(string) string {
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(enc), enc)
	})
	for _, disable := range []bool{false, true} {
		tr := &http.Transport{DisableCompression: disable}
		resp, err := tr.RoundTrip(mustRequest(t, "http://"+addr+"/"))
		require.NoError(t, err)
		err = respguard.Decode(resp)
		if !disable {
			assert.True(t, resp.Uncompressed, "the transport took a layer off (the attack)")
			assert.ErrorIs(t, err, respguard.ErrEncoding)
			resp.Body.Close()
			continue
		}
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, body, got)
		resp.Body.Close()
		tr.CloseIdleConnections()
	}
}

func mustRequest(t *testing.T, url string) *http.Request {
	r, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	return r
}

// rawServer answers every request on a loopback listener with the bytes answer returns for its
// path, written as they are, and closes the connection.
func rawServer(t *testing.T, answer func(path string) string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, answer(req.URL.Path))
			}()
		}
	}()
	return ln.Addr().String()
}

func TestPartialReadsEveryLine(t *testing.T) {
	for name, resp := range map[string]*http.Response{
		"status 206":                         {StatusCode: 206, Header: http.Header{}},
		"Content-Range":                      {StatusCode: 200, Header: http.Header{"Content-Range": {"bytes 0-2/28"}}},
		"Content-Range after an empty line":  {StatusCode: 200, Header: http.Header{"Content-Range": {"", "bytes 0-2/28"}}},
		"an empty Content-Range":             {StatusCode: 200, Header: http.Header{"Content-Range": {""}}},
		"multipart/byteranges":               {StatusCode: 200, Header: http.Header{"Content-Type": {"multipart/byteranges; boundary=x"}}},
		"multipart/byteranges on a 2nd line": {StatusCode: 200, Header: http.Header{"Content-Type": {"text/plain", "multipart/byteranges; boundary=x"}}},
	} {
		assert.True(t, respguard.Partial(resp), name)
	}
	assert.False(t, respguard.Partial(&http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}}))
}

func TestMediaTypeReadsEveryLine(t *testing.T) {
	for _, c := range []struct {
		lines []string
		want  string
		err   bool
	}{
		{nil, "", false},
		{[]string{"application/json"}, "application/json", false},
		{[]string{"text/event-stream", "text/event-stream; charset=utf-8"}, "text/event-stream", false},
		{[]string{"application/json", "text/event-stream"}, "", true},
		{[]string{"", "text/event-stream"}, "", true},
		{[]string{"text/event-stream", "TEXT/HTML"}, "", true},
	} {
		mt, err := respguard.MediaType(http.Header{"Content-Type": c.lines})
		assert.Equal(t, c.err, err != nil, "%q", c.lines)
		if !c.err {
			assert.Equal(t, c.want, mt, "%q", c.lines)
		} else {
			assert.ErrorIs(t, err, respguard.ErrFields)
		}
	}
}

func TestInPiecesReadsEveryLine(t *testing.T) {
	for _, lines := range [][]string{{"application/json"}, {"text/event-stream"}, {"application/vnd.api+json"},
		{"application/x-ndjson"}, {"text/plain", "application/json"}, {"", "text/event-stream"}} {
		assert.True(t, respguard.InPieces(http.Header{"Content-Type": lines}), "%q", lines)
	}
	for _, lines := range [][]string{nil, {"text/html"}, {"image/png", "application/octet-stream"}} {
		assert.False(t, respguard.InPieces(http.Header{"Content-Type": lines}), "%q", lines)
	}
}

// TestScrubHeaderReadsNames: an upstream can put a credential in a field's name, which
// net/http writes canonical (its case changed), and in a trailer it announces.
func TestScrubHeaderReadsNames(t *testing.T) {
	n := respguard.Build([]string{secret}, nil)
	h := http.Header{http.CanonicalHeaderKey(secret): {"1"}, "X-" + strings.ToUpper(secret): {"1"}, "X-Ok": {"fine"}}
	assert.True(t, n.ScrubHeader(h))
	assert.Equal(t, http.Header{"X-Ok": {"fine"}}, h)
	trailer := http.Header{http.CanonicalHeaderKey(secret): nil, "X-Checksum": nil}
	assert.True(t, n.ScrubHeader(trailer))
	assert.Equal(t, http.Header{"X-Checksum": nil}, trailer)
}

// FuzzFieldsReadFromAllLines holds the fields the guard reads to a reading of every line:
// Content-Encoding, Content-Type and Content-Range given as any lines (a fuzzed text split at
// each '|'). Decode decodes exactly the stack the lines list, in order, or refuses it, and
// leaves no line; MediaType names the lines' one type or refuses lines that disagree; Partial
// sees a range on any line.
func FuzzFieldsReadFromAllLines(f *testing.F) {
	for _, s := range []struct{ ce, ct, cr string }{
		{"gzip|gzip", "application/json", ""}, {"|gzip", "text/event-stream|application/json", "|bytes 0-2/9"},
		{"GZIP|br", "application/json; charset=utf-8|application/json", ""}, {"br, gzip|zstd", "", "bytes 0-2/9"},
		{"gzip|x-unknown", "multipart/byteranges; boundary=x", ""}, {"identity|deflate| gzip ", "text/plain|", ""},
		{"gzip,|br", "TEXT/EVENT-STREAM|text/event-stream", ""}, {"gzip|gzip|gzip|gzip|gzip", "", ""},
	} {
		f.Add(s.ce, s.ct, s.cr, uint16(200))
	}
	f.Add("", "", "", uint16(206))
	body := []byte(`{"echo":"` + secret + `"}`)
	known := map[string]bool{"gzip": true, "x-gzip": true, "deflate": true, "br": true, "zstd": true}
	f.Fuzz(func(t *testing.T, ce, ct, cr string, status uint16) {
		lines := func(s string) []string {
			if s == "" {
				return nil
			}
			return strings.Split(s, "|")
		}
		h := http.Header{}
		for name, v := range map[string]string{"Content-Encoding": ce, "Content-Type": ct, "Content-Range": cr} {
			if l := lines(v); l != nil {
				h[name] = l
			}
		}
		var stack []string
		decodable := true
		for _, l := range h["Content-Encoding"] {
			for c := range strings.SplitSeq(l, ",") {
				if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
					stack = append(stack, c)
					decodable = decodable && known[c]
				}
			}
		}
		decodable = decodable && len(stack) <= respguard.MaxCodings
		sent := body
		if decodable {
			sent, _ = respguardtest.Encode(body, stack...)
		}
		resp := &http.Response{StatusCode: int(status), Header: h.Clone(), Body: io.NopCloser(bytes.NewReader(sent))}
		err := respguard.Decode(resp)
		if !decodable {
			require.ErrorIs(t, err, respguard.ErrEncoding, "%q", h["Content-Encoding"])
		} else {
			require.NoError(t, err, "%q", h["Content-Encoding"])
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, body, got, "every layer, in order: %q", h["Content-Encoding"])
			if len(stack) > 0 { // lines that list no coding (identity, white space) may stay
				require.Empty(t, resp.Header.Values("Content-Encoding"))
			}
		}

		types := map[string]bool{}
		ranges := int(status) == http.StatusPartialContent || len(h["Content-Range"]) > 0
		for _, v := range h["Content-Type"] {
			mt, _ := mediatype.Of(v)
			types[mt] = true
			ranges = ranges || mt == "multipart/byteranges"
		}
		mt, err := respguard.MediaType(h)
		if len(types) > 1 {
			require.ErrorIs(t, err, respguard.ErrFields)
		} else {
			require.NoError(t, err)
			require.True(t, len(types) == 0 && mt == "" || types[mt], "%q read as %q", h["Content-Type"], mt)
		}
		require.Equal(t, ranges, respguard.Partial(&http.Response{StatusCode: int(status), Header: h}))
	})
}
