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

// Reasons the dial guard refuses a destination.
const (
	DenyLoopback    DenyReason = "loopback"
	DenyPrivate     DenyReason = "private"
	DenyLinkLocal   DenyReason = "link_local"
	DenyMetadata    DenyReason = "metadata"
	DenyCGNAT       DenyReason = "cgnat"
	DenyDeniedCIDR  DenyReason = "denied_cidr"
	DenyUnspecified DenyReason = "unspecified"
	DenyMulticast   DenyReason = "multicast"
	DenyReserved    DenyReason = "reserved"
	DenyResolve     DenyReason = "resolve_failed"
	DenyNoAddress   DenyReason = "no_address"
)

var (
	metadataAddrs = []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254")}
	cgnat         = netip.MustParsePrefix("100.64.0.0/10")
	thisNetwork   = netip.MustParsePrefix("0.0.0.0/8")
	reservedV4    = []netip.Prefix{netip.MustParsePrefix("240.0.0.0/4"), netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("192.0.0.0/24")}
	nat64         = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour     = netip.MustParsePrefix("2002::/16")
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
	timeout  time.Duration
	onDeny   func(DenyReason)
}

// DialError is a destination the guard refused (Reason set) or could not reach (Err set).
type DialError struct {
	Dest   string
	Addr   netip.Addr // the offending address, when one was resolved
	Reason DenyReason // empty when the destination was allowed but the dial failed
	Err    error
}

func (e *DialError) Error() string {
	if e.Reason != "" {
		if e.Addr.IsValid() {
			return fmt.Sprintf("destination %s (%s) denied: %s", e.Dest, e.Addr, e.Reason)
		}
		return fmt.Sprintf("destination %s denied: %s", e.Dest, e.Reason)
	}
	return fmt.Sprintf("dial %s: %v", e.Dest, e.Err)
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

// Classify returns the reason addr is refused, or "" when it may be dialed. allowPrivate
// permits loopback, private, link-local, CGNAT and the configured denied CIDRs (an explicitly
// configured in-cluster upstream); metadata, unspecified, multicast and reserved addresses are
// refused regardless.
func (g *DialGuard) Classify(addr netip.Addr, allowPrivate bool) DenyReason {
	addr = addr.Unmap().WithZone("")
	if addr.Is6() && (nat64.Contains(addr) || sixToFour.Contains(addr)) {
		// An IPv4 address embedded in IPv6 reaches that IPv4 address through a translator.
		b := addr.As16()
		var v4 [4]byte
		if nat64.Contains(addr) {
			copy(v4[:], b[12:16])
		} else {
			copy(v4[:], b[2:6])
		}
		if r := g.Classify(netip.AddrFrom4(v4), allowPrivate); r != "" {
			return r
		}
	}
	for _, m := range metadataAddrs {
		if addr == m {
			return DenyMetadata
		}
	}
	switch {
	case addr.IsUnspecified() || thisNetwork.Contains(addr):
		return DenyUnspecified
	case addr.IsMulticast() || addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return DenyMulticast
	}
	for _, p := range reservedV4 {
		if p.Contains(addr) {
			return DenyReserved
		}
	}
	if allowPrivate {
		return ""
	}
	switch {
	case addr.IsLoopback():
		return DenyLoopback
	case addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast():
		return DenyLinkLocal
	case addr.IsPrivate():
		return DenyPrivate
	case cgnat.Contains(addr):
		return DenyCGNAT
	}
	for _, p := range g.denied {
		if p.Contains(addr) {
			return DenyDeniedCIDR
		}
	}
	return ""
}

// Dial resolves dst once, refuses it if any of its addresses is denied, and connects to the
// first checked address that accepts. The returned AddrPort is the address actually dialed.
func (g *DialGuard) Dial(ctx context.Context, dst hostport.Addr, allowPrivate bool) (net.Conn, netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
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
		return nil, deny(netip.Addr{}, DenyNoAddress, nil)
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
