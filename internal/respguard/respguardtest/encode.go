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

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// Encode applies codings to body in order and returns the result and its Content-Encoding.
// "deflate" is zlib-wrapped, "deflate-raw" is raw deflate sent as "deflate". It panics on a
// coding it does not know: it serves tests only.
func Encode(body []byte, codings ...string) ([]byte, string) {
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
			panic("respguardtest: no encoder for " + c)
		}
		if err == nil {
			_, err = w.Write(body)
		}
		if err == nil {
			err = w.Close()
		}
		if err != nil {
			panic(err)
		}
		body = buf.Bytes()
		names = append(names, name)
	}
	return body, strings.Join(names, ", ")
}
