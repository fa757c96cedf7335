package httpconn

import (
	"net"
	"testing"
)

// FuzzHeadGuard feeds arbitrary bytes to the head guard, whole and split at one point: it never
// panics, and what it flags (which head, which code) does not depend on how the bytes were
// split across reads, which is the network's choice, not the sandbox's.
func FuzzHeadGuard(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: y\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
		"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n\x16\x03\x01",
		"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s), uint16(7))
	}
	f.Fuzz(func(t *testing.T, b []byte, split uint16) {
		whole := newGuard(nil, 256, nil)
		whole.scan(append([]byte(nil), b...))
		parts := newGuard(nil, 256, nil)
		at := int(split) % (len(b) + 1)
		parts.scan(append([]byte(nil), b[:at]...))
		parts.scan(append([]byte(nil), b[at:]...))
		if whole.bad != parts.bad || (whole.why == nil) != (parts.why == nil) ||
			(whole.why != nil && whole.why.Code != parts.why.Code) {
			t.Fatalf("split at %d changes the verdict: whole bad=%d %v, split bad=%d %v", at, whole.bad, whole.why, parts.bad, parts.why)
		}
	})
}

var _ net.Conn = (*guard)(nil)
