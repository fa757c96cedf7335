package call

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Release is what the connection server that writes a request's answer (internal/httpconn)
// learns from the request's call: whether the answer's final bytes wait for the call's event
// (blocking delivery: Begin says so), and whether they must never be sent because the event
// was not confirmed written (Finish says so). The server puts one in each request's context
// (WithRelease) before the handler runs; the handler begins the request's call from that
// context and ends it before it returns, so the server decides with both answers known.
//
// What "final bytes" are is the server's to hold: the last bytes of a body, the last chunk.
// A half may hold more where its protocol has an earlier end (the gateway: the JSON-RPC
// response in an SSE stream) and asks Cut before it lets them go.
type Release struct {
	hold atomic.Bool
	cut  atomic.Bool
}

type releaseKey struct{}

// WithRelease returns ctx carrying r.
func WithRelease(ctx context.Context, r *Release) context.Context {
	return context.WithValue(ctx, releaseKey{}, r)
}

// ReleaseFrom returns the Release ctx carries, or nil.
func ReleaseFrom(ctx context.Context) *Release {
	r, _ := ctx.Value(releaseKey{}).(*Release)
	return r
}

// Holds reports that the answer's final bytes wait until the handler returned (its call has
// finished, and with it the write of its event). A nil Release holds nothing.
func (r *Release) Holds() bool { return r != nil && r.hold.Load() }

// Cut reports that the call's event was not confirmed written: the answer must not be
// completed (the connection closes without its final bytes).
func (r *Release) Cut() bool { return r != nil && r.cut.Load() }

// ErrShutdown is the cause with which the connection server cancels the requests still
// running when the shutdown drain is over; their calls' events say CodeShutdown.
var ErrShutdown = errors.New("sandgate is shutting down: the drain is over")

// blockingRecorder is a Recorder that may wait for the write (audit.Writer).
type blockingRecorder interface{ Blocking() bool }

// InFlight is the number of calls begun and not finished.
func (c *Core) InFlight() int64 { return c.inflight.Load() }

// Drained waits until every call begun has finished (and so written its event, or given up),
// polling, or until ctx ends. Serve calls it before it closes the audit log.
func (c *Core) Drained(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for c.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
	return nil
}

// cutAnswer marks the answer as one that must not complete.
func (r *Release) cutAnswer() {
	if r != nil {
		r.cut.Store(true)
	}
}
