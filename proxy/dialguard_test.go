package proxy

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestClassify(t *testing.T) {
	g := &DialGuard{denied: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	tests := []struct {
		name         string
		addr         string
		allowPrivate bool
		want         DenyReason
	}{
		{"public IPv4 is allowed", "93.184.216.34", false, ""},
		{"public IPv6 is allowed", "2606:4700::1111", false, ""},
		{"IPv4 loopback is denied", "127.0.0.1", false, DenyLoopback},
		{"IPv6 loopback is denied", "::1", false, DenyLoopback},
		{"RFC 1918 address is denied", "10.0.0.1", false, DenyPrivate},
		{"RFC 1918 172.16/12 is denied", "172.20.1.1", false, DenyPrivate},
		{"IPv6 unique local address is denied", "fd12::1", false, DenyPrivate},
		{"link-local address is denied", "169.254.1.1", false, DenyLinkLocal},
		{"IPv6 link-local address is denied", "fe80::1", false, DenyLinkLocal},
		{"AWS metadata address is denied", "169.254.169.254", false, DenyMetadata},
		{"AWS IPv6 metadata address is denied", "fd00:ec2::254", false, DenyMetadata},
		{"metadata address is denied even when private is allowed", "169.254.169.254", true, DenyMetadata},
		{"IPv4-mapped metadata address is denied", "::ffff:169.254.169.254", false, DenyMetadata},
		{"NAT64 embedding of a private address is denied", "64:ff9b::a00:1", false, DenyPrivate},
		{"6to4 embedding of loopback is denied", "2002:7f00:1::", false, DenyLoopback},
		{"CGNAT address is denied", "100.64.0.1", false, DenyCGNAT},
		{"configured pod CIDR is denied", "203.0.113.7", false, DenyDeniedCIDR},
		{"unspecified address is denied", "0.0.0.0", false, DenyUnspecified},
		{"this-network address is denied even when private is allowed", "0.1.2.3", true, DenyUnspecified},
		{"multicast address is denied", "224.0.0.1", false, DenyMulticast},
		{"reserved address is denied", "240.0.0.1", false, DenyReserved},
		{"loopback is allowed when the route allows private upstreams", "127.0.0.1", true, ""},
		{"private address is allowed when the route allows private upstreams", "10.1.2.3", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, g.Classify(netip.MustParseAddr(tt.addr), tt.allowPrivate))
		})
	}
}

type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return m[host], nil
}
