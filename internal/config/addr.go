package config

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// validateHostPort checks an address the way net.Listen and net.Dial will read it, so that a
// typo fails at load (and in --check-config) rather than when serve binds or dials: host empty
// (every interface), an IP address or a host name; port a number from 1 to 65535.
func validateHostPort(errs *fieldErrors, field, addr, example string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		errs.add(field, "%q is not host:port (for example %s)", addr, example)
		return
	}
	n, err := strconv.Atoi(port)
	switch {
	case err != nil:
		errs.add(field, "port %q is not a number", port)
	case n < 1 || n > 65535:
		errs.add(field, "port %d out of range 1-65535", n)
	}
	if host == "" {
		return
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return
	}
	if strings.Contains(host, ":") || len(validation.IsDNS1123Subdomain(strings.ToLower(host))) > 0 {
		errs.add(field, "host %q is neither an IP address nor a host name", host)
	}
}

// listenersOverlap refuses two listeners on one address: the second bind would fail at start
// (address already in use). Addresses overlap when their ports are equal and their hosts are
// equal or one of them is every interface ("", 0.0.0.0, ::).
func listenersOverlap(errs *fieldErrors, l Listen) {
	addrs := []struct{ field, addr string }{{"listen.mcp", l.MCP}, {"listen.proxy", l.Proxy}, {"listen.admin", l.Admin}}
	for i, a := range addrs {
		for _, b := range addrs[:i] {
			if a.addr != "" && b.addr != "" && sameListenAddr(a.addr, b.addr) {
				errs.add(a.field, "%q is the address of %s too; each listener needs its own port", a.addr, b.field)
			}
		}
	}
}

func sameListenAddr(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb {
		return false
	}
	if anyHost(ha) || anyHost(hb) {
		return true
	}
	ia, errA := netip.ParseAddr(ha)
	ib, errB := netip.ParseAddr(hb)
	if errA == nil && errB == nil {
		return ia.Unmap() == ib.Unmap()
	}
	return strings.EqualFold(ha, hb)
}

// anyHost is a listen host that means every interface.
func anyHost(h string) bool {
	ip, err := netip.ParseAddr(h)
	return h == "" || err == nil && ip.IsUnspecified()
}
