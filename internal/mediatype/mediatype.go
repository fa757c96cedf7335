// Package mediatype reads the media type of a Content-Type header as mime.ParseMediaType
// does, without the parameters map ParseMediaType makes for every header: the request paths
// read the media type of every request and response (JSON-RPC bodies, event streams) and
// never their parameters, and the map was ~260 B and ~0.3 µs of each tools/call.
package mediatype

import "mime"

// Of is the media type of v, lower case, exactly as mime.ParseMediaType returns it, with its
// error. A plain value (a lower-case type/subtype of token characters, nothing else) is
// returned as it is; any other goes through mime.ParseMediaType (FuzzOf holds them equal).
func Of(v string) (string, error) {
	if plain(v) {
		return v, nil
	}
	mt, _, err := mime.ParseMediaType(v)
	return mt, err
}

// plain reports a value ParseMediaType would return unchanged: one slash between two
// non-empty runs of token characters without upper-case letters.
func plain(v string) bool {
	slash := -1
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '/':
			if slash >= 0 {
				return false
			}
			slash = i
		case c <= ' ' || c >= 0x7f || 'A' <= c && c <= 'Z' || isTSpecial(c):
			return false
		}
	}
	return slash > 0 && slash < len(v)-1
}

// isTSpecial reports the tspecials of RFC 2045 (section 5.1), which end a token.
func isTSpecial(c byte) bool {
	switch c {
	case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=':
		return true
	}
	return false
}
