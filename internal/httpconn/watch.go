package httpconn

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/call"
)

// watchAfter is how long a handler may run before its connection is watched for the client
// going away. net/http's server watches from the start of every request (a goroutine, a read
// that parks and a deadline to wake it: about 8% of a proxied request's CPU); a request
// answered sooner than this is not worth it, and one that waits on a model for seconds is
// cancelled upstream when its sandbox disconnects.
const watchAfter = 500 * time.Millisecond

// watchStarted, when set (by tests), is called as a watch starts reading.
var watchStarted func()

// aLongTimeAgo ends a read in progress.
var aLongTimeAgo = time.Unix(1, 0)

// watch cancels a request's context when its client closes the connection while the handler
// still runs. It starts only once the request's body was read to its end (before that, the
// body's own read sees the close), and not for a request that takes the connection over.
type watch struct {
	c       *conn
	body    *connBody
	cancel  context.CancelFunc
	timer   *time.Timer
	mu      sync.Mutex
	stopped bool
	running chan struct{} // closed when the watching read returned
}

// watchRequest arms a watch for req and returns the request with its cancelable context, which
// carries rel, the release of its answer (call.Release).
func (c *conn) watchRequest(req *http.Request, body *connBody, rel *call.Release) (*http.Request, *watch) {
	ctx, cancel := context.WithCancel(c.srv.base)
	req = req.WithContext(call.WithRelease(ctx, rel))
	w := &watch{c: c, body: body, cancel: cancel}
	if req.Method != http.MethodConnect && req.Header.Get("Upgrade") == "" {
		w.timer = time.AfterFunc(watchAfter, w.start)
	}
	return req, w
}

func (w *watch) start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || !w.body.ended() || w.c.br.Buffered() > 0 {
		return // over, still reading its body, or the next request is here already
	}
	w.running = make(chan struct{})
	if watchStarted != nil {
		watchStarted()
	}
	go func() {
		defer close(w.running)
		var b [1]byte
		n, err := w.c.lim.r.Read(b[:])
		if n == 1 {
			w.c.lim.pend, w.c.lim.pending = b[0], true // the next request's first byte
			return
		}
		if err != nil && !isTimeout(err) {
			w.cancel() // the client is gone
		}
	}()
}

// stop ends the watch once the handler returned, and the request's context with it.
func (w *watch) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Lock()
	w.stopped = true
	running := w.running
	w.mu.Unlock()
	if running != nil {
		_ = w.c.g.SetReadDeadline(aLongTimeAgo)
		<-running
		_ = w.c.g.SetReadDeadline(time.Time{})
	}
	w.cancel()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
