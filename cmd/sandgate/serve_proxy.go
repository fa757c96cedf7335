package main

import (
	"fmt"

	"github.com/sandgate/sandgate/proxy"
)

// newProxyComponent builds the egress proxy on listen.proxy (forward proxy and /routes/).
func newProxyComponent(d *serveDeps) (component, error) {
	p, err := proxy.New(proxy.Options{
		Config:      d.cfg.Proxy,
		Identity:    d.identity,
		Core:        d.core,
		Credentials: d.creds,
		Meters:      d.meters,
		Tracer:      d.tracer,
		Log:         d.log.With("component", "proxy"),
		Drain:       d.cfg.Shutdown.DrainD(),
	})
	if err != nil {
		return nil, fmt.Errorf("build proxy: %w", err)
	}
	// p.Serve, not an http.Server: it wraps each connection in the proxy's request-smuggling
	// and header-size guard before any HTTP parsing.
	return listenerComponent("proxy", d.cfg.Listen.Proxy, d, p.Serve), nil
}
