// Package respguardtest helps the tests of both halves play a misbehaving upstream (a body in
// any stack of content codings) and check what sandboxes read (Reads).
package respguardtest

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// Encode applies codings to body in order and returns the result and its Content-Encoding.
// "deflate" is zlib-wrapped, "deflate-raw" is raw deflate sent as "deflate".
func Encode(t testing.TB, body []byte, codings ...string) ([]byte, string) {
	t.Helper()
	names := make([]string, 0, len(codings))
	for _, c := range codings {
		var buf bytes.Buffer
		var w io.WriteCloser
		var err error
		name := c
		switch c {
		case "gzip", "x-gzip":
			w = gzip.NewWriter(&buf)
		case "deflate":
			w = zlib.NewWriter(&buf)
		case "deflate-raw":
			w, err = flate.NewWriter(&buf, flate.DefaultCompression)
			name = "deflate"
		case "br":
			w = brotli.NewWriter(&buf)
		case "zstd":
			w, err = zstd.NewWriter(&buf)
		case "identity":
			names = append(names, c)
			continue
		default:
			t.Fatalf("respguardtest: no encoder for %q", c)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(body); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		body = buf.Bytes()
		names = append(names, name)
	}
	return body, strings.Join(names, ", ")
}
