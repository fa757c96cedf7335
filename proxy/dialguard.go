package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/proxy/hostport"
)

// DenyReason says why the dial guard refused a destination. It is bounded and flows unchanged
// into the audit event's outcome error and the sandgate.proxy.dial_denied metric label.
type DenyReason string

// Reasons the dial guard refuses a destination. Every row of the special-purpose address table
// (specialpurpose_table.go) carries one of the registry reasons; docs/egress-proxy.md lists
// which blocks map to which.
const (
	// Registry reasons that allow_private lifts (an in-cluster upstream).
	DenyLoopback  DenyReason = "loopback"   // 127.0.0.0/8, ::1
	DenyPrivate   DenyReason = "private"    // RFC 1918, fc00::/7
	DenyLinkLocal DenyReason = "link_local" // 169.254.0.0/16, fe80::/10
	DenyCGNAT     DenyReason = "cgnat"      // 100.64.0.0/10

	// Reasons that neither allow_private nor allowed_cidrs lift.
	DenyMetadata    DenyReason = "metadata"    // cloud metadata and credential endpoints
	DenyUnspecified DenyReason = "unspecified" // 0.0.0.0/8, ::
	DenyMulticast   DenyReason = "multicast"   // 224.0.0.0/4, ff00::/8
	DenyBroadcast   DenyReason = "broadcast"   // 255.255.255.255

	// Registry reasons that only an allowed_cidrs entry inside the block lifts.
	DenyReserved           DenyReason = "reserved"            // 240.0.0.0/4; IPv6 outside 2000::/3
	DenyProtocolAssignment DenyReason = "protocol_assignment" // 192.0.0.0/24, 2001::/23, dummy prefixes
	DenyAnycastService     DenyReason = "anycast_service"     // PCP, TURN, DNS-SD SRP, AS112, AMT
	DenyDocumentation      DenyReason = "documentation"       // TEST-NET-1/2/3, 2001:db8::/32, 3fff::/20
	DenyBenchmarking       DenyReason = "benchmarking"        // 198.18.0.0/15, 2001:2::/48
	DenyDiscard            DenyReason = "discard"             // 100::/64
	DenyORCHID             DenyReason = "orchid"              // ORCHID, ORCHIDv2, DETs
	DenySRv6               DenyReason = "srv6"                // 5f00::/16
	DenySiteLocal          DenyReason = "site_local"          // fec0::/10
	// Translation and tunnel forms: the embedded IPv4 address is decided first (a special one is
	// refused with its own reason); a public one still gets these, because a translator or
	// relay is a path around the IPv4 checks that the operator has to open on purpose.
	DenyNAT64          DenyReason = "nat64"           // 64:ff9b::/96, 64:ff9b:1::/48
	Deny6to4           DenyReason = "6to4"            // 2002::/16, 192.88.99.0/24
	DenyTeredo         DenyReason = "teredo"          // 2001::/32
	DenyIPv4Compatible DenyReason = "ipv4_compatible" // ::/96
	DenyIPv4Translated DenyReason = "ipv4_translated" // ::ffff:0:0:0/96 (SIIT)

	// Operator configuration and resolution.
	DenyDeniedCIDR DenyReason = "denied_cidr"
	DenyResolve    DenyReason = "resolve_failed"
	DenyNoAddress  DenyReason = "no_address"
)

// Resolver looks names up. net.DefaultResolver satisfies it; tests inject their own.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DialFunc connects to an already checked "ip:port".
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// DialGuard resolves a destination once, classifies every address, and dials only a checked
// address, so a name cannot be re-resolved to a forbidden address between check and connect
// (DNS rebinding). It never follows a name to a second lookup.
type DialGuard struct {
	resolver Resolver
	dial     DialFunc
	denied   []netip.Prefix
	allowed  []netip.Prefix // allowed_cidrs: registry blocks the operator opens on purpose
	// connectTo (proxy.connect_to) dials these destinations at the operator's address instead
	// of resolving them.
	connectTo map[hostport.Addr]netip.AddrPort
	timeout   time.Duration
	onDeny    func(DenyReason)
}

// DialError is a destination the guard refused (Reason set) or could not reach (Err set).
type DialError struct {
	Dest   string
	Addr   netip.Addr // the offending address, when one was resolved
	Reason DenyReason // empty when the destination was allowed but the dial failed
	Err    error
}

func (e *DialError) Error() string {
	switch {
	case e.Reason == DenyResolve || e.Reason == DenyNoAddress:
		// Not a denial: the name did not resolve. Err says which name and why.
		return e.Err.Error()
	case e.Reason != "" && e.Addr.IsValid():
		return fmt.Sprintf("destination %s (%s) denied: %s", e.Dest, e.Addr, e.Reason)
	case e.Reason != "":
		return fmt.Sprintf("destination %s denied: %s", e.Dest, e.Reason)
	}
	// The dialer's own "dial tcp 127.0.0.1:443: " would repeat what Dest says.
	cause := e.Err
	var op *net.OpError
	if errors.As(cause, &op) && op.Op == "dial" && op.Err != nil {
		cause = op.Err
	}
	return fmt.Sprintf("dial %s: %v", e.Dest, cause)
}

func (e *DialError) Unwrap() error { return e.Err }

// Denied reports whether err is a refusal by the guard, and why.
func Denied(err error) (DenyReason, bool) {
	var de *DialError
	if errors.As(err, &de) && de.Reason != "" {
		return de.Reason, true
	}
	return "", false
}

// Classify returns the reason addr is refused, or "" when it may be dialed.
//
// An address is allowed only if it is global unicast (IPv4 outside every special-purpose block,
// IPv6 inside 2000::/3 and outside every special-purpose block) and not in denied_cidrs, or if
// an exception below opens it. IPv4-mapped addresses are decided as the IPv4 address they are.
// Other IPv6 forms that reach an IPv4 address through a translator or tunnel (NAT64, 6to4,
// Teredo client and server, IPv4-compatible, SIIT) are decided on that IPv4 address first; when
// it is public, the form itself is still refused with its own reason unless allowed_cidrs opens
// its block.
//
// Exceptions: allowPrivate (a route's allow_private) lifts loopback, private, link-local, CGNAT
// and denied_cidrs. An allowed_cidrs entry lifts the reason of the most specific registry block
// containing the address when the entry lies inside that block (allowing 2001::/23 does not open
// the Teredo /32 within it; allowing 0.0.0.0/0 opens nothing), and the reserved IPv6 space when
// the entry is a /8 or longer. Metadata endpoints, unspecified, multicast and broadcast
// addresses are refused regardless.
func (g *DialGuard) Classify(addr netip.Addr, allowPrivate bool) DenyReason {
	if !addr.IsValid() {
		return DenyUnspecified
	}
	addr = addr.Unmap().WithZone("")
	for _, m := range metadataAddrs {
		if addr == m {
			return DenyMetadata
		}
	}
	if b := specialBlockOf(addr); b != nil {
		v4s, ok := embeddedIPv4(addr, b, g.allowed)
		if !ok {
			return b.Reason
		}
		for _, v4 := range v4s {
			if r := g.Classify(v4, allowPrivate); r != "" {
				return r
			}
		}
		if b.Reason != "" && !g.lifts(b.Reason, addr, b.Prefix, allowPrivate) {
			return b.Reason
		}
	} else if addr.Is6() && !globalUnicast.Contains(addr) && !g.lifts(DenyReserved, addr, netip.PrefixFrom(addr, 8).Masked(), allowPrivate) {
		return DenyReserved
	}
	if allowPrivate {
		return ""
	}
	for _, p := range g.denied {
		if p.Contains(addr) {
			return DenyDeniedCIDR
		}
	}
	return ""
}

// lifts reports whether reason r, given for addr in block, is waived by allowPrivate or by an
// allowed_cidrs entry that lies inside block.
func (g *DialGuard) lifts(r DenyReason, addr netip.Addr, block netip.Prefix, allowPrivate bool) bool {
	switch r {
	case DenyMetadata, DenyUnspecified, DenyMulticast, DenyBroadcast:
		return false
	case DenyLoopback, DenyPrivate, DenyLinkLocal, DenyCGNAT:
		if allowPrivate {
			return true
		}
	}
	for _, p := range g.allowed {
		if p.Contains(addr) && p.Bits() >= block.Bits() && block.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// Dial resolves dst once, refuses it if any of its addresses is denied, and connects to the
// first checked address that accepts. The returned AddrPort is the address actually dialed.
func (g *DialGuard) Dial(ctx context.Context, dst hostport.Addr, allowPrivate bool) (net.Conn, netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if to, ok := g.connectTo[dst]; ok {
		return g.dialConnectTo(ctx, dst, to)
	}
	addrs, err := g.resolve(ctx, dst, allowPrivate)
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	var last error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, uint16(dst.Port))
		c, err := g.dial(ctx, "tcp", ap.String())
		if err == nil {
			return c, ap, nil
		}
		last = err
	}
	return nil, netip.AddrPort{}, &DialError{Dest: dst.String(), Err: last}
}

// dialConnectTo dials dst at the address proxy.connect_to names for it. The operator chose that
// address, as a route's allow_private chooses a private upstream, so it is classified with
// allow_private: metadata and the other never-lifted reasons still refuse it.
func (g *DialGuard) dialConnectTo(ctx context.Context, dst hostport.Addr, to netip.AddrPort) (net.Conn, netip.AddrPort, error) {
	dest := dst.String() + " via connect_to " + to.String()
	if r := g.Classify(to.Addr(), true); r != "" {
		if g.onDeny != nil {
			g.onDeny(r)
		}
		return nil, netip.AddrPort{}, &DialError{Dest: dest, Addr: to.Addr(), Reason: r}
	}
	c, err := g.dial(ctx, "tcp", to.String())
	if err != nil {
		return nil, netip.AddrPort{}, &DialError{Dest: dest, Err: err}
	}
	return c, to, nil
}

// resolve returns the checked addresses of dst.
func (g *DialGuard) resolve(ctx context.Context, dst hostport.Addr, allowPrivate bool) ([]netip.Addr, error) {
	deny := func(a netip.Addr, r DenyReason, err error) error {
		if g.onDeny != nil {
			g.onDeny(r)
		}
		return &DialError{Dest: dst.String(), Addr: a, Reason: r, Err: err}
	}
	var addrs []netip.Addr
	if ip, ok := dst.IP(); ok {
		addrs = []netip.Addr{ip}
	} else {
		found, err := g.resolver.LookupNetIP(ctx, "ip", dst.Host)
		if err != nil {
			return nil, deny(netip.Addr{}, DenyResolve, fmt.Errorf("resolve %s: %w", dst.Host, err))
		}
		addrs = found
	}
	if len(addrs) == 0 {
		return nil, deny(netip.Addr{}, DenyNoAddress, fmt.Errorf("resolve %s: no address", dst.Host))
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap().WithZone("")
		if r := g.Classify(addrs[i], allowPrivate); r != "" {
			// One forbidden answer taints the name: a resolver mixing public and private
			// answers is an attack or a misconfiguration, and neither should be dialed.
			return nil, deny(addrs[i], r, nil)
		}
	}
	return addrs, nil
}

// dialContext adapts the guard to http.Transport.DialContext for one upstream.
func (g *DialGuard) dialContext(allowPrivate bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, portStr, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		port, _ := strconv.Atoi(portStr)
		dst, err := hostport.Parse(net.JoinHostPort(host, strconv.Itoa(port)), port)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		c, _, err := g.Dial(ctx, dst, allowPrivate)
		return c, err
	}
}
