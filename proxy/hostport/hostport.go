// Package hostport normalises the destinations sandboxes name: "host:port" from a CONNECT line,
// a Host header or a URL. Every comparison the proxy makes between destinations (CONNECT target
// against the inner Host, host against the configured hosts, host in policy input) uses the
// normalised form, so that "API.Anthropic.com.", "api.anthropic.com:443" and the IDNA form of a
// Unicode name compare equal, and names that could smuggle a different destination are refused.
package hostport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// Addr is a normalised destination: Host is a lowercase ASCII (A-label) DNS name without
// trailing dot, or an IP address in canonical form (IPv6 without brackets); Port is 1..65535.
type Addr struct {
	Host string
	Port int
}

// String is host:port with IPv6 literals bracketed.
func (a Addr) String() string { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

// Is reports, for the texts that spell a exactly as it prints, that Parse(s, defaultPort)
// returns a: a's Host alone when Port is defaultPort, or Host:Port. A normalised Addr parses to
// itself, so these need no second normalisation (an intercepted request's Host against its
// CONNECT target, on every request: the IDNA checks were ~3 µs of it). Any other text (another
// case, a trailing dot, a Unicode or bracketed form, a port with a leading zero) is false and
// left to Parse.
func (a Addr) Is(s string, defaultPort int) bool {
	rest, ok := strings.CutPrefix(s, a.Host)
	if !ok || a.Host == "" || strings.IndexByte(a.Host, ':') >= 0 || a.Port < 1 || a.Port > 65535 {
		return false
	}
	if rest == "" {
		return a.Port == defaultPort
	}
	if len(rest) < 2 || rest[0] != ':' || rest[1] == '0' || len(rest) > 6 {
		return false
	}
	n := 0
	for _, c := range []byte(rest[1:]) {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n == a.Port
}

// IP returns the address when Host is an IP literal.
func (a Addr) IP() (netip.Addr, bool) {
	ip, err := netip.ParseAddr(a.Host)
	return ip, err == nil
}

// lookup validates an ASCII name, including the Unicode label behind every "xn--" label, the way
// a resolver would look it up. Its mapping (case folding, width and compatibility forms) only
// ever meets ASCII input here, so the only thing it maps is upper case.
var lookup = idna.New(idna.MapForLookup(), idna.Transitional(false), idna.StrictDomainName(true), idna.BidiRule(), idna.VerifyDNSLength(true))

// registration converts a name that holds non-ASCII characters. It maps nothing: a character
// that lookup would map (superscript and fullwidth digits, fullwidth letters, the ideographic
// and fullwidth full stops, the fullwidth colon, upper case) is refused rather than rewritten,
// so a Unicode name can only ever become an A-label name, never an IP address, a purely numeric
// label or a name with more labels than it showed.
var registration = idna.New(idna.ValidateForRegistration(), idna.StrictDomainName(true), idna.BidiRule(), idna.VerifyDNSLength(true))

// ErrInvalid is wrapped by every error Parse returns.
var ErrInvalid = errors.New("invalid host:port")

// Parse normalises s, which is "host", "host:port", "[v6]" or "[v6]:port". A missing port is
// defaultPort. It refuses empty hosts, ports outside 1..65535 or with signs or leading zeros,
// user info, paths, zones in IPv6 literals, and names that are not valid IDNA host names. A name
// with non-ASCII characters must be a lower-case U-label sequence: characters IDNA lookup would
// map to ASCII (superscript or fullwidth digits, fullwidth dots and colons, fullwidth letters)
// are refused, so Unicode never normalises into an IP address or a different name.
func Parse(s string, defaultPort int) (Addr, error) {
	fail := func(why string) (Addr, error) { return Addr{}, fmt.Errorf("%w %q: %s", ErrInvalid, truncate(s), why) }
	if s == "" {
		return fail("empty")
	}
	if len(s) > 300 {
		return fail("too long")
	}
	if strings.ContainsAny(s, "/\\@?#% \t\r\n") {
		return fail("contains a character not allowed in host:port")
	}
	host, portStr := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return fail("unterminated [")
		}
		host = s[1:end]
		rest := s[end+1:]
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return fail("junk after ]")
			}
			portStr = rest[1:]
			if portStr == "" {
				return fail("empty port")
			}
		}
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return fail("not an IPv6 address")
		}
	case strings.Count(s, ":") == 1:
		i := strings.IndexByte(s, ':')
		host, portStr = s[:i], s[i+1:]
		if portStr == "" {
			return fail("empty port")
		}
	case strings.Count(s, ":") > 1:
		return fail("IPv6 addresses must be in brackets")
	}
	port := defaultPort
	if portStr != "" {
		p, err := parsePort(portStr)
		if err != nil {
			return fail(err.Error())
		}
		port = p
	}
	if port < 1 || port > 65535 {
		return fail("port out of range")
	}
	h, err := normaliseHost(host)
	if err != nil {
		return fail(err.Error())
	}
	return Addr{Host: h, Port: port}, nil
}

func parsePort(s string) (int, error) {
	if len(s) > 5 || (len(s) > 1 && s[0] == '0') {
		return 0, errors.New("port is not a number between 1 and 65535")
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, errors.New("port is not a number")
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

func normaliseHost(host string) (string, error) {
	if host == "" {
		return "", errors.New("empty host")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return "", errors.New("IPv6 zones are not allowed")
		}
		return ip.Unmap().String(), nil
	}
	if looksNumeric(host) {
		// 0x7f.1, 2130706433, 127.1: forms some resolvers read as IPs. Refused rather than guessed.
		return "", errors.New("numeric host that is not a dotted-quad IPv4 address")
	}
	if !utf8.ValidString(host) {
		return "", errors.New("host is not valid UTF-8")
	}
	h := strings.TrimSuffix(host, ".")
	if !isASCII(h) {
		// Only ASCII letters are folded; everything else must already be in the canonical
		// (lower case, unmapped) form. "¹⁶⁹.²⁵⁴.¹⁶⁹.²⁵⁴" would map to the metadata address.
		a, err := registration.ToASCII(asciiLower(h))
		if err != nil {
			return "", fmt.Errorf("not a valid host name (non-ASCII characters must be a lower-case IDNA U-label, nothing that maps to ASCII): %v", err)
		}
		h = a
	}
	a, err := lookup.ToASCII(h)
	if err != nil {
		return "", fmt.Errorf("not a valid host name: %v", err)
	}
	a = strings.ToLower(a)
	// The A-label form must itself be a valid name that maps to itself; anything else is a
	// name two parsers could read differently.
	if again, err := lookup.ToASCII(a); err != nil || again != a {
		return "", errors.New("not a valid host name")
	}
	if a == "" || strings.HasSuffix(a, ".") {
		return "", errors.New("empty host")
	}
	// Belt and braces: whatever the conversion did, a name never comes out as an address.
	if _, err := netip.ParseAddr(a); err == nil || looksNumeric(a) {
		return "", errors.New("host name converts to a numeric form")
	}
	return a, nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// asciiLower folds A-Z only; Unicode case folding is a mapping, and mappings are refused.
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}, s)
}

// looksNumeric reports whether the last label starts with a digit, the way a DNS name never
// should but inet_aton-style IPv4 forms do.
func looksNumeric(h string) bool {
	h = strings.TrimSuffix(h, ".")
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return false
	}
	if strings.HasPrefix(strings.ToLower(last), "0x") {
		return true
	}
	for _, c := range []byte(last) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
