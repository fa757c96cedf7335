package call

import (
	"context"
	"net"
	"sync"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// LimitPerSource wraps a sandbox-facing listener so that one source address holds at most max
// connections at once. A connection over the cap is closed as soon as it is accepted, with one
// rejection event of kind (rate-limited like every rejection) and code too_many_connections.
// max <= 0 leaves ln as it is.
func (c *Core) LimitPerSource(ln net.Listener, max int, kind audit.Kind, resolve identity.Resolver) net.Listener {
	if max <= 0 {
		return ln
	}
	return &perSource{Listener: ln, max: max, core: c, kind: kind, resolve: resolve, open: map[string]int{}}
}

type perSource struct {
	net.Listener
	max     int
	core    *Core
	kind    audit.Kind
	resolve identity.Resolver
	mu      sync.Mutex
	open    map[string]int
}

func (l *perSource) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		l.mu.Lock()
		over := l.open[src] >= l.max
		if !over {
			l.open[src]++
		}
		l.mu.Unlock()
		if !over {
			return &countedConn{Conn: c, release: func() { l.release(src) }}, nil
		}
		id := identity.FromRemoteAddr(l.resolve, c.RemoteAddr().String())
		_ = c.Close()
		l.core.Reject(context.Background(), l.kind, id, audit.Target{},
			Refuse(CodeTooManyConnections, "source %s has %d open connections to this listener, the limit", src, l.max))
	}
}

func (l *perSource) release(src string) {
	l.mu.Lock()
	if l.open[src]--; l.open[src] <= 0 {
		delete(l.open, src)
	}
	l.mu.Unlock()
}

type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// NetConn is the connection counted, for what needs more of it than net.Conn (httpconn closes
// its writing half).
func (c *countedConn) NetConn() net.Conn { return c.Conn }

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
