package main

import "github.com/sandgate/sandgate/internal/config"

// listenerBuilders lists the request-serving listeners the config enables, besides admin.
func listenerBuilders(cfg *config.Config) []func(*serveDeps) (component, error) {
	var b []func(*serveDeps) (component, error)
	if cfg.Listen.MCP != "" {
		b = append(b, newGatewayComponent)
	}
	if cfg.Listen.Proxy != "" {
		b = append(b, newProxyComponent)
	}
	return b
}
