package httpconn

import (
	"io"
	"net"
	"time"
)

// An answer given before its request's body was read whole (a 413 for a body over the limit,
// a refusal that closes the connection) must reach a client that is still sending that body.
// Closing the connection with the rest of the body unread makes the kernel reset it: the
// client's writes fail, a client that reads only once its body is out (Python's http.client,
// and so requests and the SDKs built on it) never sees the answer, and an answer still queued
// to be sent is dropped with the connection. So the connection first closes its writing half
// (the client gets the answer and its end), then reads and drops what the client still sends of
// the body, up to lingerBytes within lingerFor, and only then closes: no reset unless the client
// sends more, or slower, than that. (net/http's server closes its writing half and waits half a
// second without reading, rstAvoidanceDelay: a client sending megabytes meets a reset there.)
const (
	lingerBytes = 64 << 20
	lingerFor   = 5 * time.Second
)

// lingerBody reads and drops what is left of a request's body before its connection closes
// after the answer (see above).
func (c *conn) lingerBody(b *connBody) {
	if b.r == nil || b.c == nil || b.ended() || !b.continueSent() {
		return // all read, or a client waiting for 100 Continue that sends no body
	}
	closeWrite(c.g.Conn)
	_ = c.g.SetReadDeadline(time.Now().Add(lingerFor))
	bp := drainBuffers.Get().(*[8192]byte)
	defer drainBuffers.Put(bp)
	b.mu.Lock() // read past a Close (the handler's, the transport's), as drain does
	defer b.mu.Unlock()
	for left := int64(lingerBytes); left > 0; {
		n, err := b.readLocked(bp[:min(int64(len(bp)), left)])
		left -= int64(n)
		if err != nil {
			return
		}
	}
}

// closeWrite closes the writing half of c (a FIN, or TLS's close_notify), through the
// wrappers that have a NetConn.
func closeWrite(c net.Conn) {
	for c != nil {
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
			return
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		c = u.NetConn()
	}
}

// linger reads what the client still sends after a refused head, for half a second at most,
// before the connection closes: closing with unread input resets the connection, and the
// client could lose the answer it was sent (net/http's server waits as long for the same
// reason).
func (c *conn) linger() {
	_ = c.g.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.CopyN(io.Discard, c.br, 1<<20)
}

// unreadBeyond reports a body with more than limit bytes declared and not read yet.
func (b *connBody) unreadBeyond(limit int64) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.eof && b.length >= 0 && b.length-b.n > limit
}
