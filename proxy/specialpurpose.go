package proxy

import "net/netip"

//go:generate go run gen_specialpurpose.go ../../shared/data/special-purpose-addresses.csv specialpurpose_table.go

// specialBlock is one row of the special-purpose address table (specialpurpose_table.go,
// generated from the IANA IPv4 and IPv6 Special-Purpose Address Registries and the blocks of the
// address-space registries that are not in them).
type specialBlock struct {
	Prefix netip.Prefix
	Name   string
	RFC    string // the registry's reference, e.g. "RFC6052"
	// Reachable is the registry's "Globally Reachable" column. The guard denies the block either
	// way: a globally reachable special-purpose block is a protocol's anycast service, a
	// translator or a tunnel, never the public host a sandbox means to reach.
	Reachable reachability
	// Embeds says where an IPv4 address sits in the block's IPv6 addresses, if anywhere.
	Embeds embedding
	// Reason is what the guard answers for an address of the block. It is empty only for the
	// IPv4-mapped block, whose addresses are decided as the IPv4 address they carry.
	Reason DenyReason
}

type reachability uint8

const (
	reachableNo reachability = iota
	reachableYes
	reachableNA // the registry says N/A (a block of blocks, or deprecated)
)

type embedding uint8

const (
	embedNone embedding = iota
	// embedLast32: bits 96–127 (IPv4-compatible, IPv4-mapped, SIIT, the well-known NAT64 /96).
	embedLast32
	// embed6to4: bits 16–47 (RFC 3056).
	embed6to4
	// embedTeredo: the server at bits 32–63, the client at bits 96–127 inverted (RFC 4380).
	embedTeredo
	// embedNAT64Configured: the local-use NAT64 block (RFC 8215) places the IPv4 address where
	// RFC 6052 puts it for the prefix length the network uses, which only the operator knows:
	// the length of the allowed_cidrs entry that covers the address.
	embedNAT64Configured
)

// globalUnicast is the only IPv6 space IANA allocates for global unicast; the rest of the IPv6
// address-space registry is reserved by the IETF or has a row in the table.
var globalUnicast = netip.MustParsePrefix("2000::/3")

// metadataAddrs are the cloud metadata and credential endpoints. All sit inside blocks of the
// table; they get their own reason because allow_private and allowed_cidrs never open them.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack instance metadata
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task credentials
	netip.MustParseAddr("169.254.170.23"),  // AWS EKS Pod Identity credentials
	netip.MustParseAddr("fd00:ec2::254"),   // AWS instance metadata over IPv6
	netip.MustParseAddr("fd00:ec2::23"),    // AWS EKS Pod Identity credentials over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud metadata
	netip.MustParseAddr("192.0.0.192"),     // Oracle Cloud metadata
}

// specialBlockOf returns the most specific table row that contains addr, or nil.
func specialBlockOf(addr netip.Addr) *specialBlock {
	var best *specialBlock
	for i := range specialPurpose {
		b := &specialPurpose[i]
		if b.Prefix.Contains(addr) && (best == nil || b.Prefix.Bits() > best.Prefix.Bits()) {
			best = b
		}
	}
	return best
}

// embeddedIPv4 returns the IPv4 addresses an IPv6 address of block b reaches through a
// translator or tunnel. ok is false when the position cannot be known (local-use NAT64 without a
// covering allowed_cidrs entry of an RFC 6052 length).
func embeddedIPv4(addr netip.Addr, b *specialBlock, allowed []netip.Prefix) (v4s []netip.Addr, ok bool) {
	a := addr.As16()
	v4 := func(i, j, k, l int) netip.Addr { return netip.AddrFrom4([4]byte{a[i], a[j], a[k], a[l]}) }
	switch b.Embeds {
	case embedNone:
		return nil, true
	case embedLast32:
		return []netip.Addr{v4(12, 13, 14, 15)}, true
	case embed6to4:
		return []netip.Addr{v4(2, 3, 4, 5)}, true
	case embedTeredo:
		client := netip.AddrFrom4([4]byte{^a[12], ^a[13], ^a[14], ^a[15]})
		return []netip.Addr{client, v4(4, 5, 6, 7)}, true
	case embedNAT64Configured:
		bits := -1
		for _, p := range allowed {
			if p.Contains(addr) && b.Prefix.Bits() <= p.Bits() && p.Bits() > bits {
				bits = p.Bits()
			}
		}
		// RFC 6052 section 2.2: bits 64–71 (byte 8) are the zero "u" octet and are skipped.
		switch bits {
		case 48:
			return []netip.Addr{v4(6, 7, 9, 10)}, true
		case 56:
			return []netip.Addr{v4(7, 9, 10, 11)}, true
		case 64:
			return []netip.Addr{v4(9, 10, 11, 12)}, true
		case 96:
			return []netip.Addr{v4(12, 13, 14, 15)}, true
		}
	}
	return nil, false
}
