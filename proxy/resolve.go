package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
)

// overrideResolver answers names of proxy.resolve_overrides from its map and every other name
// from next. The dial guard classifies its answers like any other.
type overrideResolver struct {
	addrs map[string]netip.Addr // lower-case name without trailing dot
	next  Resolver
}

func newOverrideResolver(overrides map[string]string, next Resolver) (*overrideResolver, error) {
	r := &overrideResolver{addrs: make(map[string]netip.Addr, len(overrides)), next: next}
	for name, ip := range overrides {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return nil, fmt.Errorf("proxy.resolve_overrides %s: %w", name, err)
		}
		r.addrs[strings.ToLower(strings.TrimSuffix(name, "."))] = a
	}
	return r, nil
}

// LookupNetIP implements Resolver.
func (r *overrideResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, ok := r.addrs[strings.ToLower(strings.TrimSuffix(host, "."))]; ok {
		return []netip.Addr{a}, nil
	}
	return r.next.LookupNetIP(ctx, network, host)
}
