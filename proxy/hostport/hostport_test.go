package hostport

import (
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
	for _, s := range []string{"api.anthropic.com", "[::1]:443", "10.0.0.1:80", "bücher.de", "a:b:c", "[", "x:"} {
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
	})
}
