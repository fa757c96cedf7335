package call

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// BodyTiming bounds how long a sandbox may take to send a request body: Timeout for the first
// bytes and the rest, plus one second for every MinRate bytes received, so a large body sent
// at a sane rate always fits and a trickle (one byte every few seconds) is cut.
type BodyTiming struct {
	Timeout time.Duration
	MinRate int64 // bytes per second; 0 means no allowance beyond Timeout
}

// DefaultBodyTiming is the default of both halves: 30 s, plus a second per 16 KiB.
var DefaultBodyTiming = BodyTiming{Timeout: 30 * time.Second, MinRate: 16 << 10}

// BoundBody makes r.Body's reads fail once the sandbox is slower than t allows: it sets the
// connection's read deadline and moves it as bytes arrive. The deadline is cleared when the
// body ends. A read cut this way fails with an error IsBodyTimeout recognises, and the returned
// BoundedBody says so (nil when the request has no body or the connection takes no deadlines).
func BoundBody(w http.ResponseWriter, r *http.Request, t BodyTiming) *BoundedBody {
	if r.Body == nil || r.Body == http.NoBody || t.Timeout <= 0 {
		return nil
	}
	rc := http.NewResponseController(w)
	b := &BoundedBody{ReadCloser: r.Body, rc: rc, t: t, start: time.Now()}
	if b.rc.SetReadDeadline(b.start.Add(t.Timeout)) != nil {
		return nil // the connection takes no deadlines (a test writer)
	}
	r.Body = b
	return b
}

// Cut reports whether the sandbox was too slow and the body's read was cut.
func (b *BoundedBody) Cut() bool { return b != nil && b.cut }

// BoundedBody is a request body read under BoundBody's deadline.
type BoundedBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	t     BodyTiming
	start time.Time
	read  int64
	done  bool
	cut   bool
}

func (b *BoundedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	switch {
	case err != nil && !b.done:
		b.done = true
		b.cut = IsBodyTimeout(err)
		_ = b.rc.SetReadDeadline(time.Time{})
	case n > 0 && b.t.MinRate > 0:
		allowance := b.t.Timeout + time.Duration(b.read*int64(time.Second)/b.t.MinRate)
		_ = b.rc.SetReadDeadline(b.start.Add(allowance))
	}
	return n, err
}

// IsBodyTimeout reports a body read cut by BoundBody's deadline.
func IsBodyTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
