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
