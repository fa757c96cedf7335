// Package identity answers "who is calling": it maps the TCP peer address of a connection to
// the sandbox behind it.
//
// Identity comes from the peer address alone. Headers a sandbox sends (X-Forwarded-For,
// X-Real-IP, X-Sandbox-*, Forwarded …) are never read here, so a sandbox cannot claim to be
// another one. An address that maps to no live sandbox is anonymous: Known is false and the
// policy denies it by default.
package identity

import (
	"net"
	"net/http"
	"net/netip"
)

// Identity is the caller of one request, as the policy sees it in input.identity.
type Identity struct {
	Namespace string            `json:"namespace"`
	Sandbox   string            `json:"sandbox"`
	Template  string            `json:"template"`
	Claim     string            `json:"claim"`
	Labels    map[string]string `json:"labels"`
	SourceIP  string            `json:"source_ip"`
	// Known is false for an address that maps to no sandbox.
	Known bool `json:"known"`
	// Unverified says why an address that belongs to a sandbox pod is nevertheless an unknown
	// caller: UnverifiedPrefix and the link of the identity chain that could not be verified
	// (Link). Empty for a known caller and for an address that maps to no sandbox pod at all.
	Unverified string `json:"unverified,omitempty"`
}

// UnverifiedPrefix starts every Identity.Unverified value.
const UnverifiedPrefix = "identity_unverified:"

// Anonymous is the identity of an address that maps to no sandbox.
func Anonymous(addr netip.Addr) Identity {
	return Identity{SourceIP: addrString(addr)}
}

// Key names the sandbox for rate limits, grants and metrics: "namespace/sandbox", or
// "anonymous" for an unknown caller.
func (id Identity) Key() string {
	if !id.Known {
		return "anonymous"
	}
	return id.Namespace + "/" + id.Sandbox
}

// Resolver maps a peer address to an Identity. Implementations must be safe for concurrent use
// and fast: Resolve runs on every request.
type Resolver interface {
	Resolve(addr netip.Addr) Identity
}

// FromRemoteAddr resolves the peer of a connection given as net/http's Request.RemoteAddr or
// net.Conn.RemoteAddr().String(). An unparsable address resolves to anonymous.
func FromRemoteAddr(r Resolver, remoteAddr string) Identity {
	addr, ok := ParsePeer(remoteAddr)
	if !ok {
		return Identity{}
	}
	return r.Resolve(addr)
}

// ParsePeer parses "ip:port" (or a bare IP) into an address with any IPv4-in-IPv6 mapping and
// zone removed, so that 127.0.0.2 and ::ffff:127.0.0.2 are the same caller.
func ParsePeer(remoteAddr string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	host := remoteAddr
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// FromRequest resolves the caller of an HTTP request from its connection's peer address
// (Request.RemoteAddr as net/http sets it). No header is read: X-Forwarded-For, X-Real-IP,
// Forwarded and X-Sandbox-* cannot change who the caller is.
func FromRequest(r Resolver, req *http.Request) Identity {
	return FromRemoteAddr(r, req.RemoteAddr)
}
