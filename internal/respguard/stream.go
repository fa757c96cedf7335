package respguard

import (
	"io"
	"net/http"

	"github.com/sandgate/sandgate/internal/mediatype"
)

// Reader is a body on its way to a sandbox, scrubbed as it is read. Reads into a buffer large
// enough are scrubbed in place; only the held tail is copied.
type Reader struct {
	src   io.Reader
	sc    Scanner
	carry []byte // held back by the last scan
	ready []byte // scrubbed bytes not yet read (reads smaller than a window)
	buf   []byte
	err   error
}

// NewReader scrubs src with n; sse reads it in pieces too; onHit is called at each credential.
func NewReader(src io.Reader, n *Needles, sse bool, onHit func()) *Reader {
	r := &Reader{src: src}
	r.sc.Reset(n, sse, onHit)
	return r
}

func (r *Reader) Read(p []byte) (int, error) {
	if r.sc.n.Empty() {
		return r.src.Read(p)
	}
	for {
		if len(r.ready) > 0 {
			n := copy(p, r.ready)
			r.ready = r.ready[n:]
			return n, nil
		}
		if r.err != nil {
			return 0, r.err
		}
		if len(p) >= len(r.carry)+2*r.sc.n.maxBody {
			if n := r.fill(p); n > 0 {
				return n, nil
			}
			continue
		}
		if need := len(r.carry) + 4*r.sc.n.maxBody + 512; cap(r.buf) < need {
			r.buf = make([]byte, need)
		}
		r.buf = r.buf[:cap(r.buf)]
		n := r.fill(r.buf)
		r.ready = r.buf[:n]
	}
}

// fill reads into dst after the carried bytes, scrubs the window and returns how many bytes
// of dst may go on; the rest is carried.
func (r *Reader) fill(dst []byte) int {
	k := copy(dst, r.carry)
	n, err := r.src.Read(dst[k:])
	w := dst[:k+n]
	if err != nil {
		r.err = err
	}
	rel := r.sc.Scan(w, k, err != nil)
	r.carry = append(r.carry[:0], w[rel:]...)
	if err != nil { // the final scan: Read returns r.err from now on and never fills again
		r.sc.release()
	}
	return rel
}

// Hits is the number of credentials found so far.
func (r *Reader) Hits() int { return r.sc.hits }

// Writer scrubs what is written through it to a sandbox. Held bytes are written when later
// writes settle them, or by End.
type Writer struct {
	dst io.Writer
	sc  Scanner
	buf []byte
}

// NewWriter scrubs what is written to dst with n; sse reads it in pieces too.
func NewWriter(dst io.Writer, n *Needles, sse bool, onHit func()) *Writer {
	w := &Writer{dst: dst}
	w.sc.Reset(n, sse, onHit)
	return w
}

func (w *Writer) Write(p []byte) (int, error) {
	if w.sc.n.Empty() {
		return w.dst.Write(p)
	}
	carried := len(w.buf)
	w.buf = append(w.buf, p...)
	rel := w.sc.Scan(w.buf, carried, false)
	if err := w.out(rel); err != nil {
		return 0, err
	}
	return len(p), nil
}

// out writes the first n bytes of the buffer and keeps the rest.
func (w *Writer) out(n int) error {
	if n == 0 {
		return nil
	}
	_, err := w.dst.Write(w.buf[:n])
	w.buf = append(w.buf[:0], w.buf[n:]...)
	return err
}

// End scrubs and writes what is held: the stream ended.
func (w *Writer) End() error {
	if len(w.buf) == 0 {
		return nil
	}
	w.sc.Scan(w.buf, len(w.buf), true)
	return w.out(len(w.buf))
}

// Hits is the number of credentials found so far.
func (w *Writer) Hits() int { return w.sc.hits }

// IsEventStream reports whether a response of these headers is an event stream (read in
// pieces too).
func IsEventStream(h http.Header) bool {
	mt, _ := mediatype.Of(h.Get("Content-Type"))
	return mt == "text/event-stream"
}
