package httpconn

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sandgate/sandgate/internal/call"
)

// response is the http.ResponseWriter of one request inside an intercepted tunnel: an
// HTTP/1.1 response written as net/http's server writes it (status line and headers at the
// first write, Content-Length when the handler set one, chunked otherwise, trailers after the
// last chunk), buffered until the handler flushes or returns, so a small response leaves in one
// TLS record.
//
// While its call holds the answer (call.Release: blocking audit delivery), the response keeps
// back the end of what the handler wrote, from its last byte that is not white space on (held),
// until the handler writes more, flushes, or returns: the answer is not complete, by its framing
// (Content-Length, the last chunk) nor by its content (a JSON value's closing bracket), before
// the handler has returned, and the handler returns after its call's event is written. When the
// call's event was not confirmed written (Release.Cut) the held bytes and the end of the body
// are never sent: the connection closes.
type response struct {
	c      *conn
	req    *http.Request
	body   *connBody
	header http.Header
	bw     *bufio.Writer // from the pool from the first byte written until finish

	wrote    bool // the final status line is written
	noBody   bool // HEAD, 204, 304: no body whatever the handler writes
	chunked  bool
	close    bool     // the connection closes after this response
	cl       int64    // declared Content-Length, -1 if none
	n        int64    // body bytes written
	trailers []string // trailer names the handler declared before the head was written
	hijacked bool
	err      error // the first write error: the client is gone

	rel     call.Release // the call's word on the answer (see call.Release)
	held    []byte       // the end of the body held back; aliases heldBuf while it fits
	heldBuf [8]byte
}

func (w *response) Header() http.Header { return w.header }

func (w *response) buf() *bufio.Writer {
	if w.bw == nil {
		w.bw = getWriter(w.c.g)
	}
	return w.bw
}

func (w *response) WriteHeader(code int) {
	if w.wrote || w.hijacked {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code == http.StatusContinue && w.body.continueSent() {
		return // the upstream's own 100 Continue, after ours: the client has one already
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An informational response (103 Early Hints) goes out at once; the header map stays
		// the handler's for the final response.
		w.writeStatus(code)
		_ = w.header.WriteSubset(w.buf(), nil)
		_, _ = w.buf().WriteString("\r\n")
		w.flush()
		return
	}
	w.wrote = true
	h := w.header
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified
	if v := h.Get("Content-Length"); v != "" {
		if cl, err := strconv.ParseInt(v, 10, 64); err == nil && cl >= 0 {
			w.cl = cl
		} else {
			h.Del("Content-Length")
		}
	}
	if v, ok := h["Trailer"]; ok {
		for _, t := range v {
			for _, name := range strings.Split(t, ",") {
				if name = http.CanonicalHeaderKey(strings.TrimSpace(name)); name != "" {
					w.trailers = append(w.trailers, name)
				}
			}
		}
	}
	h.Del("Transfer-Encoding")
	switch {
	case w.noBody || w.cl >= 0 || code == http.StatusSwitchingProtocols:
	case w.req.ProtoAtLeast(1, 1):
		w.chunked = true
		h.Set("Transfer-Encoding", "chunked")
	default:
		w.close = true // HTTP/1.0 without a length: the body ends with the connection
	}
	if w.req.Close || httpguts.HeaderValuesContainsToken(h["Connection"], "close") || w.body.unreadBeyond(maxDrain) {
		// A body left unread past what drain reads (a 413 for a body over the limit) ends
		// the connection, and the answer says so, as net/http's server does.
		w.close = true
	}
	if w.close {
		h.Set("Connection", "close")
	} else if !w.req.ProtoAtLeast(1, 1) {
		h.Set("Connection", "keep-alive")
	}
	if _, ok := h["Date"]; !ok {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	w.writeStatus(code)
	_ = h.WriteSubset(w.buf(), trailerKeys(h))
	_, _ = w.buf().WriteString("\r\n")
}

// trailerKeys are the header keys net/http keeps for the trailer (http.TrailerPrefix).
func trailerKeys(h http.Header) map[string]bool {
	var ex map[string]bool
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			if ex == nil {
				ex = map[string]bool{}
			}
			ex[k] = true
		}
	}
	return ex
}

func (w *response) writeStatus(code int) {
	b := w.buf()
	_, _ = b.WriteString("HTTP/1.1 ")
	_, _ = b.WriteString(strconv.Itoa(code))
	_ = b.WriteByte(' ')
	_, _ = b.WriteString(http.StatusText(code))
	_, _ = b.WriteString("\r\n")
}

func (w *response) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.noBody {
		if w.req.Method == http.MethodHead {
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.cl >= 0 && w.n+int64(len(p)) > w.cl {
		return 0, http.ErrContentLength
	}
	w.n += int64(len(p))
	if w.rel.Holds() {
		w.err = w.writeHolding(p)
	} else {
		w.err = w.writeBody(nil, p)
	}
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// maxHeld bounds what is held: a body that ends in more white space than this keeps only its
// last maxHeld bytes back (the byte before them went out).
const maxHeld = 256

// writeHolding writes what was held and p, except p's end from its last byte that is not
// white space on, which it holds instead (all of p when p is white space).
func (w *response) writeHolding(p []byte) error {
	end := len(p)
	for end > 0 && isSpace(p[end-1]) {
		end--
	}
	if end > 0 {
		end-- // the last byte that is not white space is held too
		err := w.writeBody(w.held, p[:end])
		w.held = append(w.heldBuf[:0], p[end:]...)
		return err
	}
	w.held = append(w.held, p...)
	if over := len(w.held) - maxHeld; over > 0 {
		err := w.writeBody(w.held[:over], nil)
		w.held = append(w.heldBuf[:0], w.held[over:]...)
		return err
	}
	return nil
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\r' || b == '\n' }

// writeBody writes a then b as body bytes: one chunk when chunked.
func (w *response) writeBody(a, b []byte) error {
	n := len(a) + len(b)
	if n == 0 {
		return nil
	}
	bw := w.buf()
	if w.chunked {
		_, _ = bw.WriteString(strconv.FormatInt(int64(n), 16))
		_, _ = bw.WriteString("\r\n")
	}
	_, _ = bw.Write(a)
	_, err := bw.Write(b)
	if w.chunked {
		_, err = bw.WriteString("\r\n")
	}
	return err
}

// releaseHeld writes what is held.
func (w *response) releaseHeld() {
	if len(w.held) > 0 && w.err == nil {
		w.err = w.writeBody(w.held, nil)
	}
	w.held = w.held[:0]
}

// FlushError sends what is buffered (http.ResponseController's flush).
func (w *response) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.releaseHeld() // a flush sends everything: a stream's end is its last chunk
	w.flush()
	return w.err
}

func (w *response) Flush() { _ = w.FlushError() }

func (w *response) flush() {
	if w.bw != nil && w.err == nil {
		w.err = w.bw.Flush()
	}
}

// SetReadDeadline and SetWriteDeadline are http.ResponseController's deadlines (the request
// body's timing uses the read deadline).
func (w *response) SetReadDeadline(t time.Time) error  { return w.c.g.SetReadDeadline(t) }
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.g.SetWriteDeadline(t) }

// Hijack hands the connection to the handler (an upgraded protocol); the tunnel closes when the
// handler returns.
func (w *response) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	w.hijacked = true
	w.c.set.hijacked(w.c)
	if w.bw != nil {
		_ = w.bw.Flush()
	}
	// goproxy, the one taker (a CONNECT), writes to the connection itself: the writer handed
	// over is a small one rather than 4 KiB allocated for every tunnel.
	return w.c.g, bufio.NewReadWriter(w.c.br, bufio.NewWriterSize(w.c.g, 64)), nil
}

// finish ends the response after the handler returned: the head if nothing was written, the
// held bytes, the last chunk and the trailers, everything flushed, the writer back in its pool.
// A body shorter than its Content-Length closes the connection. An answer whose call's event was
// not confirmed written (Release.Cut) is cut instead: what is still buffered is dropped and the
// connection closes, so the client never sees a complete answer.
func (w *response) finish() {
	if w.rel.Cut() {
		w.abort()
		return
	}
	if !w.wrote {
		if _, ok := w.header["Content-Length"]; !ok {
			w.header.Set("Content-Length", "0")
		}
		w.WriteHeader(http.StatusOK)
	}
	w.releaseHeld()
	if w.chunked && w.err == nil {
		b := w.buf()
		_, _ = b.WriteString("0\r\n")
		w.writeTrailers(b)
		_, _ = b.WriteString("\r\n")
	}
	if !w.noBody && w.cl >= 0 && w.n < w.cl {
		w.close = true
	}
	w.flush()
	if w.bw != nil {
		putWriter(w.bw)
		w.bw = nil
	}
	if w.err != nil {
		w.close = true
	}
}

// complete reports an answer sent whole: not cut (Release), no write failed, its declared
// length written.
func (w *response) complete() bool {
	return !w.rel.Cut() && w.err == nil && (w.noBody || w.cl < 0 || w.n >= w.cl)
}

// abort drops what is buffered and closes the connection after a cut answer.
func (w *response) abort() {
	w.close = true
	w.held = nil
	if w.bw != nil {
		putWriter(w.bw)
		w.bw = nil
	}
}

func (w *response) writeTrailers(b *bufio.Writer) {
	if len(w.trailers) == 0 && trailerKeys(w.header) == nil {
		return // the common case: no trailer, no map built
	}
	t := http.Header{}
	for _, k := range w.trailers {
		if vv, ok := w.header[k]; ok {
			t[k] = vv
		}
	}
	for k, vv := range w.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			t[http.CanonicalHeaderKey(strings.TrimPrefix(k, http.TrailerPrefix))] = vv
		}
	}
	for k, vv := range t {
		if !httpguts.ValidTrailerHeader(k) {
			delete(t, k)
			continue
		}
		if len(vv) == 0 {
			delete(t, k)
		}
	}
	_ = t.Write(b)
}
