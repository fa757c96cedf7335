package hostport

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // "" means refused
	}{
		{"host without port takes the default port", "api.anthropic.com", "api.anthropic.com:443"},
		{"upper case and trailing dot are normalised", "API.Anthropic.COM.:443", "api.anthropic.com:443"},
		{"explicit port is kept", "example.com:8443", "example.com:8443"},
		{"unicode name becomes its A-label", "bücher.example:443", "xn--bcher-kva.example:443"},
		{"IPv4 literal is kept", "10.0.0.1:443", "10.0.0.1:443"},
		{"bracketed IPv6 literal is canonicalised", "[0:0:0:0:0:0:0:1]:443", "[::1]:443"},
		{"IPv4-mapped IPv6 literal becomes IPv4", "[::ffff:169.254.169.254]:80", "169.254.169.254:80"},
		{"bracketed IPv6 without port takes the default", "[fd00:ec2::254]", "[fd00:ec2::254]:443"},
		{"unbracketed IPv6 is refused", "::1", ""},
		{"IPv6 zone is refused", "[fe80::1%25eth0]:443", ""},
		{"empty host is refused", ":443", ""},
		{"empty port is refused", "example.com:", ""},
		{"port zero is refused", "example.com:0", ""},
		{"port above 65535 is refused", "example.com:65536", ""},
		{"port with leading zero is refused", "example.com:0443", ""},
		{"signed port is refused", "example.com:+443", ""},
		{"user info is refused", "user@example.com:443", ""},
		{"path is refused", "example.com/evil:443", ""},
		{"decimal IPv4 form is refused", "2130706433:443", ""},
		{"hex IPv4 form is refused", "0x7f.0.0.1:443", ""},
		{"short IPv4 form is refused", "127.1:443", ""},
		{"underscore name is refused", "a_b.example:443", ""},
		{"space is refused", "exa mple.com", ""},
		{"superscript digit alone is refused, not mapped to a numeric host", "²", ""},
		{"superscript digits that spell the metadata IP are refused", "¹⁶⁹.²⁵⁴.¹⁶⁹.²⁵⁴:80", ""},
		{"fullwidth digits that spell an IP are refused", "１２７.０.０.１:443", ""},
		{"fullwidth dots between ASCII digits are refused", "127．0．0．1:443", ""},
		{"ideographic full stops between ASCII digits are refused", "10。0。0。1:443", ""},
		{"fullwidth colon is not a port separator", "example.com：443", ""},
		{"fullwidth letters are refused rather than folded to ASCII", "ｅｘａｍｐｌｅ.com", ""},
		{"ideographic full stop as a label separator is refused", "例え。jp", ""},
		{"upper-case Unicode letter is refused rather than case folded", "BÜCHER.example", ""},
		{"upper-case ASCII beside a Unicode label is folded", "Bücher.EXAMPLE", "xn--bcher-kva.example:443"},
		{"A-label of a superscript digit is refused", "xn--pba:443", ""},
		{"A-labels that decode to the superscript metadata IP are refused", "xn--wba463nja.xn--pba473nca.xn--wba463nja.xn--pba473nca:80", ""},
		{"upper-case A-label is folded", "XN--BCHER-KVA.example", "xn--bcher-kva.example:443"},
		{"Unicode name ending in digits is refused", "bücher.１", ""},
		{"numeric first labels of a DNS name are kept", "0.pool.ntp.org:123", "0.pool.ntp.org:123"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := Parse(tt.in, 443)
			if tt.want == "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, ErrInvalid)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, a.String())
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"api.anthropic.com", "[::1]:443", "10.0.0.1:80", "bücher.de", "a:b:c", "[", "x:",
		"²", "¹⁶⁹.²⁵⁴.¹⁶⁹.²⁵⁴:80", "１２７.０.０.１", "127．0．0．1", "example.com：443", "ｅｘａｍｐｌｅ.com", "xn--pba"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := Parse(s, 443)
		if err != nil {
			return
		}
		// A normalised address parses to itself: normalisation is idempotent.
		b, err := Parse(a.String(), 1)
		if err != nil {
			t.Fatalf("Parse(%q) = %q, which does not parse again: %v", s, a, err)
		}
		if a != b {
			t.Fatalf("Parse(%q) = %q, Parse again = %q", s, a, b)
		}
		if a.Port < 1 || a.Port > 65535 || a.Host == "" {
			t.Fatalf("Parse(%q) = %+v", s, a)
		}
		if !isASCII(a.Host) || a.Host != strings.ToLower(a.Host) {
			t.Fatalf("Parse(%q) = %q, not lower-case ASCII", s, a)
		}
		// Only an ASCII IP literal becomes an address; Unicode never normalises into one.
		if _, ok := a.IP(); ok && !isASCII(s) {
			t.Fatalf("Parse(%q) = %q: a non-ASCII input became an IP address", s, a)
		}
	})
}

// FuzzIs holds Is to Parse: whatever text Is accepts for an address, Parse reads as that
// address; and an address's own spellings are accepted.
func FuzzIs(f *testing.F) {
	for _, s := range []string{"api.anthropic.com", "api.anthropic.com:443", "api.anthropic.com:0443", "API.anthropic.com",
		"api.anthropic.com.", "api.anthropic.com:+443", "[::1]:443", "::1", "10.0.0.1:80", "10.0.0.1", "xn--bcher-kva.de:8443"} {
		f.Add(s, "api.anthropic.com:443")
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, s, dest string) {
		a, err := Parse(dest, 443)
		if err != nil {
			return
		}
		// IPv6 literals print bracketed, and are always left to Parse.
		if !strings.Contains(a.Host, ":") && (!a.Is(a.String(), 1) || a.Port == 443 && !a.Is(a.Host, 443)) {
			t.Fatalf("%+v does not accept its own spelling", a)
		}
		if !a.Is(s, 443) {
			return
		}
		if b, err := Parse(s, 443); err != nil || b != a {
			t.Fatalf("Is(%q) for %+v, but Parse reads %+v, %v", s, a, b, err)
		}
	})
}
