package proxy

import (
	"strings"

	"github.com/sandgate/sandgate/internal/call"
)

// maxProxyStatusDetails bounds the details of a Proxy-Status header (the reason can quote what a
// sandbox sent).
const maxProxyStatusDetails = 256

// proxyStatus is the Proxy-Status header (RFC 9209) of a refusal: the error type for its class
// and, as details, its code and reason. Every refusal the proxy answers carries it, because a
// client often shows only the head of a refused CONNECT (curl -s prints nothing, curl -v and -i
// print the head), never its body.
func proxyStatus(rf *call.Refusal) string {
	return `sandgate; error=` + proxyStatusError(rf) + `; details="` + sfString(rf.Code+": "+rf.Reason) + `"`
}

// proxyStatusError maps a refusal to RFC 9209's error types.
func proxyStatusError(rf *call.Refusal) string {
	switch rf.Code {
	case call.CodeResolveFailed, call.CodeNoAddress:
		return "dns_error"
	case call.CodeUpstreamUnavailable:
		return "destination_unavailable"
	}
	switch rf.Class() {
	case call.ClassPolicy, call.ClassLimit:
		return "http_request_denied"
	case call.ClassUpstream:
		return "destination_unavailable"
	case call.ClassUpstreamTimeout:
		return "connection_timeout"
	case call.ClassUnavailable:
		return "proxy_internal_error"
	}
	return "http_request_error"
}

// sfString is s as the inside of a structured-field string (RFC 8941): printable ASCII, quote
// and backslash escaped, every other byte written as '?', cut at maxProxyStatusDetails bytes.
func sfString(s string) string {
	if len(s) > maxProxyStatusDetails {
		s = s[:maxProxyStatusDetails]
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
