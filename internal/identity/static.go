package identity

import (
	"fmt"
	"maps"
	"net/netip"
	"sort"
)

// StaticEntry is one sandbox of the static map: every address in Addresses (single IPs or CIDR
// prefixes) belongs to it.
type StaticEntry struct {
	Addresses []string          `json:"addresses"`
	Namespace string            `json:"namespace"`
	Sandbox   string            `json:"sandbox"`
	Template  string            `json:"template"`
	Claim     string            `json:"claim"`
	Labels    map[string]string `json:"labels"`
}

// Static is the embedded-default resolver: a fixed map of addresses and prefixes to sandboxes,
// from the config file. The most specific prefix wins; exact addresses are a hash lookup.
type Static struct {
	exact    map[netip.Addr]Identity
	prefixes []staticPrefix // longest first
}

type staticPrefix struct {
	prefix netip.Prefix
	id     Identity
}

// NewStatic builds the map. It returns an error naming the entry for an address that does not
// parse or that two entries both claim.
func NewStatic(entries []StaticEntry) (*Static, error) {
	s := &Static{exact: map[netip.Addr]Identity{}}
	seen := map[netip.Prefix]int{}
	for i, e := range entries {
		if e.Sandbox == "" {
			return nil, fmt.Errorf("sandboxes[%d].sandbox: must not be empty", i)
		}
		if len(e.Addresses) == 0 {
			return nil, fmt.Errorf("sandboxes[%d].addresses: sandbox %q has no address", i, e.Sandbox)
		}
		id := Identity{Namespace: e.Namespace, Sandbox: e.Sandbox, Template: e.Template, Claim: e.Claim,
			Labels: maps.Clone(e.Labels), Known: true}
		if id.Labels == nil {
			id.Labels = map[string]string{}
		}
		for j, a := range e.Addresses {
			p, err := parseAddressOrPrefix(a)
			if err != nil {
				return nil, fmt.Errorf("sandboxes[%d].addresses[%d]: %w", i, j, err)
			}
			if k, dup := seen[p]; dup {
				return nil, fmt.Errorf("sandboxes[%d].addresses[%d]: %s is already given to sandboxes[%d]", i, j, p, k)
			}
			seen[p] = i
			if p.IsSingleIP() {
				s.exact[p.Addr()] = id
			} else {
				s.prefixes = append(s.prefixes, staticPrefix{p, id})
			}
		}
	}
	sort.SliceStable(s.prefixes, func(a, b int) bool { return s.prefixes[a].prefix.Bits() > s.prefixes[b].prefix.Bits() })
	return s, nil
}

func parseAddressOrPrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither an IP address nor a CIDR prefix", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Resolve implements Resolver.
func (s *Static) Resolve(addr netip.Addr) Identity {
	addr = addr.Unmap()
	id, ok := s.exact[addr]
	if !ok {
		for _, p := range s.prefixes {
			if p.prefix.Contains(addr) {
				id, ok = p.id, true
				break
			}
		}
	}
	if !ok {
		return Anonymous(addr)
	}
	id.SourceIP = addr.String()
	return id
}
