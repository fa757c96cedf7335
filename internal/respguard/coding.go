package respguard

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	// The kept decoders of the codings the standard library has none for: brotli is the
	// reference decoder ported to Go, klauspost/compress's zstd is the one most Go servers
	// encode with (and already in the module graph, through OPA).
	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// ErrEncoding is a response in a content coding Sandgate cannot decode: it cannot be scanned,
// so it is refused (upstream_encoding).
var ErrEncoding = errors.New("response in a content coding Sandgate does not decode")

// ErrTooLarge is a response (decoded or not) over its bound: a decompression bomb, or more
// than a configured cap (upstream_too_large).
var ErrTooLarge = errors.New("upstream response larger than allowed")

// Bounds of decoding: a body decodes to at most maxRatio times the bytes it was sent as (past
// the first ratioGrace bytes), and a zstd frame may not ask for a window over maxZstdWindow.
// A body over them fails with ErrTooLarge as it is read; nothing is buffered.
const (
	maxRatio      = 1000
	ratioGrace    = 1 << 20
	maxZstdWindow = 8 << 20
)

// MaxCodings is the deepest stack of content codings decoded. Each coding is a decoder of its
// own, with its own window (up to 8 MiB for zstd, 16 MiB for br) and a pass over every byte: a
// header of a megabyte could list hundreds of thousands of them. Servers apply one, and a
// proxy on the way may add one more; a deeper stack is refused like an unknown coding.
const MaxCodings = 4

// Decode replaces resp's body with its decoded form when it has a Content-Encoding: gzip,
// x-gzip, deflate (zlib-wrapped or raw), br, zstd or any stack of at most MaxCodings of them,
// listed in the order they were applied, on one line or several. The header loses
// Content-Encoding and Content-Length (the decoded length is not known). identity is no
// coding. Any other coding, or a deeper stack, is ErrEncoding, resp unchanged.
//
// A response the transport already decoded (Uncompressed) is ErrEncoding too: net/http's
// transport, when it asked for gzip itself, decodes a body whose first Content-Encoding line
// says gzip and drops every line, so the codings of the others reach nobody who decodes them.
// Transports that feed Decode set DisableCompression; this refuses what one that does not
// would pass on.
//
// The errors name no coding: a coding's name is the upstream's text, and error texts end up
// in what Sandgate writes.
func Decode(resp *http.Response) error {
	if resp.Uncompressed {
		return fmt.Errorf("%w: the transport decoded a layer Sandgate did not see", ErrEncoding)
	}
	codings := contentCodings(resp.Header)
	if len(codings) == 0 {
		return nil
	}
	if len(codings) > MaxCodings {
		return fmt.Errorf("%w: a stack of more than %d codings", ErrEncoding, MaxCodings)
	}
	for i, c := range codings {
		if _, ok := decoders[c]; !ok {
			return fmt.Errorf("%w: coding %d of %d is none Sandgate decodes", ErrEncoding, i+1, len(codings))
		}
	}
	sent := &countReader{r: resp.Body}
	var r io.Reader = sent
	var closers []io.Closer
	for i := len(codings) - 1; i >= 0; i-- {
		d, err := decoders[codings[i]](r)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrEncoding, codings[i], err)
		}
		r = d
		if c, ok := d.(io.Closer); ok {
			closers = append(closers, c)
		}
	}
	resp.Body = &decodedBody{r: r, sent: sent, body: resp.Body, closers: closers}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
	return nil
}

// contentCodings are the codings of h's Content-Encoding in the order applied, identity left
// out, lower case; it stops counting one past MaxCodings.
func contentCodings(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			if c != "" && c != "identity" {
				if out = append(out, c); len(out) > MaxCodings {
					return out
				}
			}
		}
	}
	return out
}

var decoders = map[string]func(io.Reader) (io.Reader, error){
	"gzip":    gzipReader,
	"x-gzip":  gzipReader,
	"deflate": deflateReader,
	"br":      func(r io.Reader) (io.Reader, error) { return brotli.NewReader(r), nil },
	"zstd": func(r io.Reader) (io.Reader, error) {
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, err
		}
		return zstdCloser{d}, nil
	},
}

func gzipReader(r io.Reader) (io.Reader, error) {
	z, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	return z, nil
}

// deflateReader reads "deflate" as the standard says (zlib-wrapped) or as some servers send it
// (raw): a zlib stream starts with a header whose check bits hold.
func deflateReader(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(2)
	if err != nil {
		return nil, err
	}
	if head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}

type zstdCloser struct{ *zstd.Decoder }

func (z zstdCloser) Close() error { z.Decoder.Close(); return nil }

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// decodedBody is a decoded response body, bounded by the ratio to what was sent.
type decodedBody struct {
	r       io.Reader
	sent    *countReader
	body    io.ReadCloser
	closers []io.Closer
	out     int64
}

func (d *decodedBody) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.out += int64(n)
	if d.out > ratioGrace && d.out > maxRatio*max(d.sent.n, 1) {
		return n, fmt.Errorf("%w: decodes to over %d times its size", ErrTooLarge, maxRatio)
	}
	if err != nil && err != io.EOF {
		err = fmt.Errorf("decode response: %w", err)
	}
	return n, err
}

func (d *decodedBody) Close() error {
	for _, c := range d.closers {
		_ = c.Close()
	}
	return d.body.Close()
}

// Limit fails a body with ErrTooLarge once more than max bytes were read from it.
func Limit(body io.ReadCloser, max int64, what string) io.ReadCloser {
	return &limitBody{ReadCloser: body, left: max, max: max, what: what}
}

type limitBody struct {
	io.ReadCloser
	left, max int64
	what      string
}

func (l *limitBody) Read(p []byte) (int, error) {
	if l.left < 0 {
		return 0, fmt.Errorf("%w: %s over %d bytes", ErrTooLarge, l.what, l.max)
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.ReadCloser.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		return 0, fmt.Errorf("%w: %s over %d bytes", ErrTooLarge, l.what, l.max)
	}
	return n, err
}
