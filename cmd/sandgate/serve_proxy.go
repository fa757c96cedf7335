package main

import (
	"context"
	"fmt"
	"net"

	"github.com/sandgate/sandgate/proxy"
)

// newProxyComponent builds the egress proxy on listen.proxy (forward proxy and /routes/).
func newProxyComponent(d *serveDeps) (component, error) {
	p, err := proxy.New(proxy.Options{
		Config:      d.cfg.Proxy,
		Identity:    d.identity,
		Policy:      d.policy,
		Audit:       d.audit,
		Credentials: d.creds,
		Meters:      d.meters,
		Admission:   d.admission,
		Tracer:      d.tracer,
		Log:         d.log.With("component", "proxy"),
	})
	if err != nil {
		return nil, fmt.Errorf("build proxy: %w", err)
	}
	return componentFunc(func(ctx context.Context) error {
		if d.cfg.Listen.Proxy == "" {
			<-ctx.Done()
			return nil
		}
		ln, err := net.Listen("tcp", d.cfg.Listen.Proxy)
		if err != nil {
			return fmt.Errorf("proxy listener: %w", err)
		}
		d.log.Info("listening", "listener", "proxy", "addr", ln.Addr().String())
		return p.Serve(ctx, ln)
	}), nil
}
