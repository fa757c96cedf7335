package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/proxy/hostport"
)

func TestClassify(t *testing.T) {
	g := &DialGuard{denied: []netip.Prefix{netip.MustParsePrefix("100.128.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}}
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
		{"configured pod CIDR in public space is denied", "100.128.0.7", false, DenyDeniedCIDR},
		{"configured service CIDR in private space is denied as private", "10.96.0.1", false, DenyPrivate},
		{"configured CIDR is allowed when the route allows private upstreams", "100.128.0.7", true, ""},
		{"unspecified address is denied", "0.0.0.0", false, DenyUnspecified},
		{"this-network address is denied even when private is allowed", "0.1.2.3", true, DenyUnspecified},
		{"multicast address is denied", "224.0.0.1", false, DenyMulticast},
		{"reserved address is denied", "240.0.0.1", false, DenyReserved},
		{"loopback is allowed when the route allows private upstreams", "127.0.0.1", true, ""},
		{"private address is allowed when the route allows private upstreams", "10.1.2.3", true, ""},
		{"IPv6 unique local address is allowed when the route allows private upstreams", "fd12::1", true, ""},

		{"limited broadcast is denied", "255.255.255.255", false, DenyBroadcast},
		{"limited broadcast is denied even when private is allowed", "255.255.255.255", true, DenyBroadcast},
		{"IPv6 multicast is denied", "ff02::1", false, DenyMulticast},
		{"IPv6 unspecified address is denied", "::", false, DenyUnspecified},
		{"Alibaba metadata address in CGNAT space is denied as metadata", "100.100.100.200", true, DenyMetadata},
		{"Oracle metadata address is denied as metadata", "192.0.0.192", true, DenyMetadata},
		{"ECS task credential endpoint is denied as metadata", "169.254.170.2", true, DenyMetadata},
		{"benchmarking address is denied", "198.18.0.1", false, DenyBenchmarking},
		{"documentation address is denied", "192.0.2.1", false, DenyDocumentation},
		{"IPv6 documentation address is denied", "2001:db8::1", false, DenyDocumentation},
		{"IPv6 documentation 3fff::/20 is denied", "3fff::1", false, DenyDocumentation},
		{"IETF protocol assignment is denied", "192.0.0.100", false, DenyProtocolAssignment},
		{"PCP anycast is denied although globally reachable", "192.0.0.9", false, DenyAnycastService},
		{"AS112 server is denied although globally reachable", "192.175.48.1", false, DenyAnycastService},
		{"6to4 relay anycast is denied", "192.88.99.1", false, Deny6to4},
		{"reserved address is denied even when private is allowed", "240.0.0.1", true, DenyReserved},
		{"IPv6 discard prefix is denied", "100::1", false, DenyDiscard},
		{"ORCHIDv2 address is denied although globally reachable", "2001:20::1", false, DenyORCHID},
		{"SRv6 SID is denied", "5f00::1", false, DenySRv6},
		{"deprecated site-local address is denied", "fec0::1", false, DenySiteLocal},
		{"IPv6 outside 2000::/3 is denied as reserved", "4000::1", false, DenyReserved},
		{"IPv6 in ::/8 but outside ::/96 is denied as reserved", "::1:0:0:1", false, DenyReserved},
		{"an invalid address is denied", "", false, DenyUnspecified},

		{"IPv4-mapped public address is allowed, as the IPv4 address it is", "::ffff:93.184.216.34", false, ""},
		{"NAT64 form of a public address is denied as a tunnel", "64:ff9b::93.184.216.34", false, DenyNAT64},
		{"NAT64 form of the metadata address is denied as metadata", "64:ff9b::169.254.169.254", true, DenyMetadata},
		{"local-use NAT64 address is denied when no prefix length is configured", "64:ff9b:1::5db8:d822", false, DenyNAT64},
		{"6to4 form of a public address is denied as a tunnel", "2002:5db8:d822::1", false, Deny6to4},
		{"6to4 form of the metadata address is denied as metadata", "2002:a9fe:a9fe::1", false, DenyMetadata},
		{"Teredo address of a documentation client is denied with the client's reason", "2001:0:4136:e378:8000:63bf:3fff:fdd2", false, DenyDocumentation},
		{"Teredo address whose client is the metadata address is denied as metadata", "2001:0:4136:e378::5601:5601", false, DenyMetadata},
		{"Teredo address whose server is private is denied as private", "2001:0:a00:1::a247:27dd", false, DenyPrivate},
		{"Teredo address of a public client and server is denied as a tunnel", "2001:0:4136:e378::a247:27dd", false, DenyTeredo},
		{"IPv4-compatible form of loopback is denied as loopback", "::127.0.0.1", false, DenyLoopback},
		{"IPv4-compatible form of a public address is denied", "::93.184.216.34", false, DenyIPv4Compatible},
		{"SIIT form of the metadata address is denied as metadata", "::ffff:0:169.254.169.254", false, DenyMetadata},
		{"SIIT form of a public address is denied", "::ffff:0:93.184.216.34", false, DenyIPv4Translated},
		{"NAT64 form of a configured pod CIDR address is denied", "64:ff9b::100.128.0.7", false, DenyDeniedCIDR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a netip.Addr
			if tt.addr != "" {
				a = netip.MustParseAddr(tt.addr)
			}
			assert.Equal(t, tt.want, g.Classify(a, tt.allowPrivate))
		})
	}
}

func TestClassifyAllowedCIDRs(t *testing.T) {
	g := &DialGuard{
		allowed: []netip.Prefix{
			netip.MustParsePrefix("64:ff9b::/96"),        // the cluster's DNS64/NAT64
			netip.MustParsePrefix("64:ff9b:1:ab::/96"),   // a local-use NAT64 /96
			netip.MustParsePrefix("64:ff9b:1:cd00::/56"), // a local-use NAT64 /56
			netip.MustParsePrefix("192.0.2.0/25"),        // part of TEST-NET-1
			netip.MustParsePrefix("2001::/23"),           // wider than the Teredo block inside it
			netip.MustParsePrefix("::/96"),               // wider than ::1/128 inside it
			netip.MustParsePrefix("0.0.0.0/0"),           // opens nothing: wider than every block
			netip.MustParsePrefix("ff00::/8"),            // multicast is never opened
		},
		denied: []netip.Prefix{netip.MustParsePrefix("100.128.0.0/16")},
	}
	tests := []struct {
		name string
		addr string
		want DenyReason
	}{
		{"NAT64 form of a public address is allowed when 64:ff9b::/96 is allowed", "64:ff9b::93.184.216.34", ""},
		{"NAT64 form of a private address stays denied with the IPv4 reason", "64:ff9b::10.0.0.1", DenyPrivate},
		{"NAT64 form of the metadata address stays denied", "64:ff9b::169.254.169.254", DenyMetadata},
		{"NAT64 form of a denied CIDR stays denied", "64:ff9b::100.128.0.7", DenyDeniedCIDR},
		{"local-use NAT64 in an allowed /96 is decided on its last 32 bits (public)", "64:ff9b:1:ab::93.184.216.34", ""},
		{"local-use NAT64 in an allowed /96 is decided on its last 32 bits (private)", "64:ff9b:1:ab::10.0.0.1", DenyPrivate},
		{"local-use NAT64 in an allowed /56 is decided on bits 56-63 and 72-95 (public)", "64:ff9b:1:cd5d:b8:d822::", ""},
		{"local-use NAT64 in an allowed /56 is decided on bits 56-63 and 72-95 (loopback)", "64:ff9b:1:cd7f:0:1::", DenyLoopback},
		{"local-use NAT64 outside the allowed prefixes stays denied", "64:ff9b:1:ef::93.184.216.34", DenyNAT64},
		{"address inside an allowed part of a block is allowed", "192.0.2.1", ""},
		{"address in the rest of that block stays denied", "192.0.2.200", DenyDocumentation},
		{"allowing 2001::/23 does not open the Teredo block inside it", "2001:0:4136:e378::a247:27dd", DenyTeredo},
		{"allowing 2001::/23 opens the rest of that block", "2001:1::5", ""},
		{"allowing 2001::/23 does not open the AMT block inside it", "2001:3::1", DenyAnycastService},
		{"allowing ::/96 does not open IPv6 loopback", "::1", DenyLoopback},
		{"allowing ::/96 opens IPv4-compatible forms of public addresses", "::93.184.216.34", ""},
		{"allowing 0.0.0.0/0 does not open private space", "10.0.0.1", DenyPrivate},
		{"allowing ff00::/8 does not open multicast", "ff02::1", DenyMulticast},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, g.Classify(netip.MustParseAddr(tt.addr), false))
		})
	}
}

func TestDialGuardDialsOnlyTheCheckedAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	var dialed []string
	g := &DialGuard{
		resolver: mapResolver{
			"upstream.test": {netip.MustParseAddr("127.0.0.1")},
			"nat64.test":    {netip.MustParseAddr("64:ff9b::93.184.216.34")},
			"mixed.test":    {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("64:ff9b::a9fe:a9fe")},
			"teredo.test":   {netip.MustParseAddr("2001:0:4136:e378:8000:63bf:3fff:fdd2")},
		},
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dialed = append(dialed, addr)
			ap, err := netip.ParseAddrPort(addr)
			if err != nil || !ap.Addr().IsLoopback() {
				t.Errorf("guard dialed %q, which is not a loopback ip:port", addr)
				return nil, errors.New("test: refusing a non-loopback dial")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		timeout: 5 * time.Second,
	}
	tests := []struct {
		name         string
		host         string
		allowPrivate bool
		want         DenyReason
	}{
		{"loopback upstream of a route that allows private upstreams is dialed", "upstream.test", true, ""},
		{"name resolving to a NAT64 address is refused", "nat64.test", false, DenyNAT64},
		{"name with one NAT64 answer embedding the metadata address is refused", "mixed.test", true, DenyMetadata},
		{"name resolving to a Teredo address of a documentation client is refused", "teredo.test", false, DenyDocumentation},
		{"NAT64 literal of loopback is refused without allow_private", "64:ff9b::7f00:1", false, DenyLoopback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dialed = nil
			host := tt.host
			if ip, err := netip.ParseAddr(host); err == nil && ip.Is6() {
				host = "[" + host + "]"
			}
			dst, err := hostport.Parse(host, port)
			require.NoError(t, err)
			c, ap, err := g.Dial(context.Background(), dst, tt.allowPrivate)
			if tt.want != "" {
				r, ok := Denied(err)
				require.True(t, ok, "want a refusal, got %v", err)
				assert.Equal(t, tt.want, r)
				assert.Empty(t, dialed, "nothing is dialed")
				return
			}
			require.NoError(t, err)
			_ = c.Close()
			assert.Equal(t, []string{ap.String()}, dialed, "the checked address is the one dialed")
		})
	}
}

type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return m[host], nil
}

// proxy.connect_to dials a destination at the operator's address without resolving its name: a
// loopback address is dialed (the operator chose it), a metadata address never is, and every
// other destination is resolved as usual.
func TestConnectToDialsTheOperatorsAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	standIn := netip.MustParseAddrPort(ln.Addr().String())
	var dialed []string
	g := &DialGuard{
		resolver: mapResolver{"other.test": {netip.MustParseAddr("127.0.0.1")}},
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dialed = append(dialed, addr)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		connectTo: map[hostport.Addr]netip.AddrPort{
			{Host: "api.anthropic.com", Port: 443}: standIn,
			{Host: "metadata.test", Port: 80}:      netip.MustParseAddrPort("169.254.169.254:80"),
		},
		timeout: 5 * time.Second,
	}

	c, ap, err := g.Dial(context.Background(), hostport.Addr{Host: "api.anthropic.com", Port: 443}, false)
	require.NoError(t, err, "a loopback connect_to address is dialed without allow_private")
	_ = c.Close()
	assert.Equal(t, standIn, ap)
	assert.Equal(t, []string{standIn.String()}, dialed)

	dialed = nil
	_, _, err = g.Dial(context.Background(), hostport.Addr{Host: "metadata.test", Port: 80}, true)
	r, ok := Denied(err)
	require.True(t, ok, "want a refusal, got %v", err)
	assert.Equal(t, DenyMetadata, r)
	assert.Empty(t, dialed)

	_, _, err = g.Dial(context.Background(), hostport.Addr{Host: "api.anthropic.com", Port: 8443}, false)
	r, _ = Denied(err)
	assert.Equal(t, DenyNoAddress, r, "another port of the name is not redirected: it is resolved (here to nothing)")

	_, _, err = g.Dial(context.Background(), hostport.Addr{Host: "other.test", Port: int(standIn.Port())}, false)
	r, _ = Denied(err)
	assert.Equal(t, DenyLoopback, r, "other names are resolved and checked as before")
}
