package proxy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/call"
)

// defaultDrain is Serve's drain when Options.Drain is zero.
const defaultDrain = 10 * time.Second

// tunnelRequests' inner requests, as a shutdown drain sees them: a tunnel outlives the
// listener's connection set (its owner is the proxy), so the proxy waits for the requests in
// flight inside tunnels itself, then cuts them with the rest.
type tunnelDrain struct {
	inflight atomic.Int64
	// base is the context of every request inside a tunnel; cut cancels it with
	// call.ErrShutdown, so that their calls' events say "shutdown".
	base context.Context
	cut  context.CancelCauseFunc
}

func newTunnelDrain() *tunnelDrain {
	d := &tunnelDrain{}
	d.base, d.cut = context.WithCancelCause(context.Background())
	return d
}

// wait waits until no request inside a tunnel is in flight or until deadline, polling.
func (d *tunnelDrain) wait(deadline time.Time) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for d.inflight.Load() > 0 && time.Now().Before(deadline) {
		<-t.C
	}
}

// drain is Serve's end: the listener has drained (or cut) its own requests; the requests in
// tunnels get what is left of the drain, then every tunnel is cut and closed.
func (p *Proxy) drain(start time.Time) {
	p.tunnelsDrain.wait(start.Add(p.drainFor()))
	p.tunnelsDrain.cut(call.ErrShutdown)
	p.Close()
}

func (p *Proxy) drainFor() time.Duration {
	if p.opts.Drain > 0 {
		return p.opts.Drain
	}
	return defaultDrain
}

// closing reports that Close has run: a tunnel that ends now was cut by the shutdown.
func (p *Proxy) closing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}
