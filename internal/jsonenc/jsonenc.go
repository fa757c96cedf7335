// Package jsonenc appends JSON scalars to a byte slice exactly as encoding/json writes them
// (HTML escaping off), without reflection or allocation. The audit sequencer and the policy
// decision log encode every event of the process with it.
package jsonenc

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/sandgate/sandgate/internal/jsonscan"
)

// AppendFloat formats a finite float64 as encoding/json does (ES6 number formatting).
func AppendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 becomes e-9, as encoding/json writes it
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// AppendString quotes s as encoding/json does with HTML escaping off: control characters,
// quote and backslash escaped, invalid UTF-8 replaced by U+FFFD, U+2028 and U+2029 escaped.
func AppendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// ValidNumber reports whether s is a JSON number literal (RFC 8259), as encoding/json checks a
// json.Number before writing it.
func ValidNumber(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '-' {
		s = s[1:]
		if s == "" {
			return false
		}
	}
	switch {
	case s[0] == '0':
		s = s[1:]
	case '1' <= s[0] && s[0] <= '9':
		s = skipDigits(s[1:])
	default:
		return false
	}
	if len(s) >= 2 && s[0] == '.' && isDigit(s[1]) {
		s = skipDigits(s[2:])
	}
	if len(s) >= 2 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		if s[0] == '+' || s[0] == '-' {
			s = s[1:]
			if s == "" {
				return false
			}
		}
		if !isDigit(s[0]) {
			return false
		}
		s = skipDigits(s[1:])
	}
	return s == ""
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func skipDigits(s string) string {
	for s != "" && isDigit(s[0]) {
		s = s[1:]
	}
	return s
}

// AppendStringMap writes a map[string]string as encoding/json does: null when nil, keys sorted.
func AppendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	var small [8]string
	keys := small[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, k)
		b = append(b, ':')
		b = AppendString(b, m[k])
	}
	return append(b, '}')
}

// AppendMember appends "key":val to an object's members (n of them so far, counted on).
func AppendMember(out []byte, n *int, key string, val []byte) []byte {
	if *n > 0 {
		out = append(out, ',')
	}
	*n++
	return append(append(AppendString(out, key), ':'), val...)
}

// WithMember is obj, a JSON object, with member key's value val: replaced where obj has it,
// else added at the end.
func WithMember(obj []byte, key string, val []byte) (json.RawMessage, error) {
	out := make([]byte, 0, len(obj)+len(val)+len(key)+4)
	out = append(out, '{')
	n, set := 0, false
	err := jsonscan.Members(obj, func(k []byte, escaped bool, v []byte) error {
		name, err := jsonscan.KeyName(k, escaped)
		if err != nil {
			return err
		}
		if n > 0 {
			out = append(out, ',')
		}
		n++
		out = append(append(out, k...), ':')
		if name == key {
			set, v = true, val
		}
		out = append(out, v...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !set {
		out = AppendMember(out, &n, key, val)
	}
	return append(out, '}'), nil
}
