package main

import (
	"context"
	"fmt"
	"net"

	"github.com/sandgate/sandgate/gateway"
)

// newGatewayComponent builds the MCP gateway on listen.mcp (/mcp for every sandbox).
func newGatewayComponent(d *serveDeps) (component, error) {
	g, err := gateway.New(gateway.Options{
		Config:      d.cfg.Gateway,
		Identity:    d.identity,
		Core:        d.core,
		Credentials: d.creds,
		Meters:      d.meters,
		Tracer:      d.tracer,
		Sessions:    d.sessions,
		Catalogs:    d.catalogs,
		Pins:        d.policy,
		Log:         d.log.With("component", "gateway"),
	})
	if err != nil {
		return nil, fmt.Errorf("build gateway: %w", err)
	}
	// A down upstream is reported, not fatal: the replica still serves the proxy and the other
	// upstreams, so it stays ready (docs/shared-state.md, "Readiness"). It is not ready before
	// every upstream was tried once, so that no sandbox is sent to it before its catalog is known.
	d.ready.AddDegraded("gateway upstreams", g.Ready)
	d.ready.Add("gateway upstreams tried", g.Tried)
	listener := listenerComponent("mcp", d.cfg.Listen.MCP, d, func(ctx context.Context, ln net.Listener) error {
		return g.Serve(ctx, ln, d.cfg.Shutdown.DrainD())
	})
	return componentFunc(func(ctx context.Context) error {
		// The upstream sessions outlive ctx: on SIGTERM the listener stops accepting and lets the
		// calls in flight finish (up to shutdown.drain); only then are the upstreams closed.
		g.Start(context.WithoutCancel(ctx))
		defer g.Close()
		return listener.Serve(ctx)
	}), nil
}
