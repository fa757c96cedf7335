package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/config"
)

// errSessionsFull is why a sandbox's request uses the shared upstream session: every
// per-sandbox session this upstream may have is in use.
var errSessionsFull = errors.New("every per-sandbox upstream session is in use")

// sandboxSessions are the upstream sessions of the sandbox sessions, by sandbox session ID.
//
// A stateful upstream keeps per-session state: the log level, resource subscriptions, and the
// server-to-client requests (sampling, elicitation, roots) it makes on the session's streams.
// One session per sandbox session keeps one sandbox's state and messages away from another's.
// They are opened on first use, closed when the sandbox session ends or after the gateway's
// session idle timeout without use (unless they hold subscriptions), bounded by max_sessions
// (the least recently used idle one makes room).
type sandboxSessions struct {
	mu    sync.Mutex
	conns map[string]*sandboxConn
}

type sandboxConn struct {
	ready    chan struct{} // closed when dialled (cli or err set)
	cli      *client.Client
	err      error
	inUse    int
	subs     int
	lastUsed time.Time
	tools    *classList // the tools it lists (capabilities.go), guarded by the pool's mu
}

// lease is one request's use of an upstream connection.
type lease struct {
	u    *upstream
	cli  *client.Client
	gen  uint64       // the shared connection's generation
	sid  string       // the sandbox session, for a per-sandbox connection
	conn *sandboxConn // nil for the shared connection
}

// perSandbox reports whether sandbox requests to u get their own upstream session: an upstream
// in per-sandbox mode whose shared connection speaks a revision with sessions. For a stdio
// upstream the session is a process of its own, started on the sandbox session's first request
// and stopped (stdin closed, then SIGTERM, then SIGKILL) when the session ends, idles out or is
// evicted at max_sessions.
func (u *upstream) perSandbox(shared *client.Client) bool {
	return u.cfg.Sessions != config.SessionsShared && !mcp.IsModernProtocol(shared.ProtocolVersion())
}

// lease returns the connection for a request of the caller whose session key is key
// (caller.sessionKey; "" none): its own upstream session where the upstream has them, else the
// shared one.
func (u *upstream) lease(ctx context.Context, key string) (*lease, error) {
	cli, gen, err := u.client()
	if err != nil {
		return nil, err
	}
	shared := &lease{u: u, cli: cli, gen: gen}
	if key == "" || !u.perSandbox(cli) {
		return shared, nil
	}
	conn, err := u.sandboxConn(ctx, key, cli.ProtocolVersion())
	if errors.Is(err, errSessionsFull) {
		u.log.Warn("per-sandbox upstream sessions at their limit; using the shared session", "max_sessions", u.cfg.MaxSessions)
		return shared, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the sandbox's upstream session: %w", err)
	}
	return &lease{u: u, cli: conn.cli, sid: key, conn: conn}, nil
}

// sandboxConn returns sid's upstream session, dialling it on first use at the shared
// connection's protocol version. The caller releases it.
func (u *upstream) sandboxConn(ctx context.Context, sid, version string) (*sandboxConn, error) {
	p := &u.pool
	p.mu.Lock()
	c, ok := p.conns[sid]
	if !ok {
		if len(p.conns) >= u.cfg.MaxSessions && !p.evictLocked() {
			p.mu.Unlock()
			return nil, errSessionsFull
		}
		c = &sandboxConn{ready: make(chan struct{})}
		p.conns[sid] = c
	}
	c.inUse++
	c.lastUsed = time.Now()
	p.mu.Unlock()
	if !ok {
		dctx, cancel := context.WithTimeout(ctx, u.cfg.ConnectTimeout.D())
		// Declaring the sandbox's own capabilities, so that the upstream treats the sandbox as it
		// would treat it directly (the tools it lists, the requests it makes).
		cli, err := u.dial(dctx, version, u.hooks.conn(u, sid), u.hooks.capabilities(sid), true)
		cancel()
		p.mu.Lock()
		c.cli, c.err = cli, err
		if err != nil && p.conns[sid] == c {
			delete(p.conns, sid)
		}
		p.mu.Unlock()
		close(c.ready)
	}
	select {
	case <-c.ready:
	case <-ctx.Done():
		u.release(c)
		return nil, ctx.Err()
	}
	if c.err != nil {
		u.release(c)
		return nil, c.err
	}
	return c, nil
}

func (u *upstream) release(c *sandboxConn) {
	u.pool.mu.Lock()
	c.inUse--
	c.lastUsed = time.Now()
	u.pool.mu.Unlock()
}

// evictLocked closes the least recently used idle session, preferring one without resource
// subscriptions; false when every one is in use.
func (p *sandboxSessions) evictLocked() bool {
	var oldest string
	better := func(c, o *sandboxConn) bool {
		if (c.subs == 0) != (o.subs == 0) {
			return c.subs == 0
		}
		return c.lastUsed.Before(o.lastUsed)
	}
	for sid, c := range p.conns {
		if c.inUse == 0 && c.cli != nil && (oldest == "" || better(c, p.conns[oldest])) {
			oldest = sid
		}
	}
	if oldest == "" {
		return false
	}
	go p.conns[oldest].cli.Close()
	delete(p.conns, oldest)
	return true
}

// closeSessions closes the per-sandbox sessions that match, unless in use.
func (u *upstream) closeSessions(match func(*sandboxConn) bool) {
	u.pool.mu.Lock()
	var closing []*client.Client
	for sid, c := range u.pool.conns {
		if c.inUse == 0 && c.cli != nil && match(c) {
			closing = append(closing, c.cli)
			delete(u.pool.conns, sid)
		}
	}
	u.pool.mu.Unlock()
	for _, cli := range closing {
		cli.Close()
	}
}

// closeIdleSessions closes the sessions unused for the idle timeout that hold no subscription.
func (u *upstream) closeIdleSessions() {
	u.closeSessions(func(c *sandboxConn) bool { return c.subs == 0 && time.Since(c.lastUsed) > u.idle })
}

// endSession closes sandbox session sid's upstream session: the sandbox session ended, so
// whatever it still had in flight there has no one to answer.
func (u *upstream) endSession(sid string) {
	u.pool.mu.Lock()
	c, ok := u.pool.conns[sid]
	if ok {
		delete(u.pool.conns, sid)
	}
	u.pool.mu.Unlock()
	if ok {
		go func() {
			<-c.ready
			if c.cli != nil {
				c.cli.Close()
			}
		}()
	}
}

// end ends the lease. A transport failure (o) drops the connection it happened on (the
// shared one is reconnected by the supervisor); an error the upstream answered keeps it.
func (l *lease) end(o outcome, err error) {
	if l.conn != nil {
		l.u.release(l.conn)
	}
	if o == outcomeTransport {
		l.drop(err)
	}
}

func (l *lease) drop(err error) {
	if l.conn == nil {
		l.u.broken(l.gen, err)
		return
	}
	l.u.pool.mu.Lock()
	mine := l.u.pool.conns[l.sid] == l.conn
	if mine {
		delete(l.u.pool.conns, l.sid)
	}
	l.u.pool.mu.Unlock()
	if mine {
		go l.conn.cli.Close()
	}
}

// do runs one request on the connection of the request's sandbox session, if u's breaker lets
// it (isolation.go). When the upstream ended that session (404, e.g. after a restart) it
// opens a new one and retries once: the request was not processed.
func do[T any](ctx context.Context, u *upstream, f func(ctx context.Context, c *client.Client) (T, error)) (T, error) {
	var zero T
	if err := u.awaitFirstTry(ctx); err != nil { // a call at start waits for the first connection
		return zero, err
	}
	if err := u.allow(); err != nil {
		return zero, err
	}
	o := outcomeNeutral
	defer func() { u.breakerDone(o) }()
	c := callOf(ctx)
	if c == nil && u.inflight != nil {
		ctx, c, _ = u.inflight.begin(ctx, nil, u)
		defer u.inflight.end(u, c)
	}
	key := ""
	if c != nil && c.exchange() != nil {
		key = c.exchange().caller().sessionKey()
	}
	for attempt := 0; ; attempt++ {
		l, err := u.lease(ctx, key)
		if err != nil {
			if !errors.Is(err, errUpstreamDown) && ctx.Err() == nil {
				o = outcomeTransport // the sandbox's upstream session could not be opened
			}
			return zero, err
		}
		if c != nil {
			u.inflight.bind(c, l.cli) // before the upstream can send anything about it
		}
		cctx, cancel := context.WithTimeout(withConnHooks(ctx, u.hooks.conn(u, l.sid)), u.cfg.CallTimeout.D())
		cctx, rp := withReply(cctx)
		res, err := f(cctx, l.cli)
		if err != nil {
			err = boundFailure(err, rp, l.cli.GetTransport())
		}
		timedOut := cctx.Err() != nil
		cancel()
		o = classify(ctx, err, timedOut, rp)
		if err == nil || ctx.Err() != nil {
			l.end(outcomeOK, nil)
			return res, err
		}
		if errors.Is(err, transport.ErrSessionTerminated) && attempt == 0 {
			l.end(outcomeOK, nil)
			l.drop(err)
			if l.conn == nil {
				if werr := u.waitConnected(ctx); werr != nil {
					return zero, fmt.Errorf("upstream session expired and could not be re-established: %w", werr)
				}
			}
			continue
		}
		l.end(o, err)
		return zero, err
	}
}

// sessionConn is sandbox session sid's own upstream session, nil when it has none (yet).
func (u *upstream) sessionConn(sid string) *client.Client {
	u.pool.mu.Lock()
	defer u.pool.mu.Unlock()
	if c, ok := u.pool.conns[sid]; ok && c.cli != nil {
		return c.cli
	}
	return nil
}

// modernConn reports whether u's shared connection speaks 2026-07-28 or later.
func (u *upstream) modernConn() bool {
	cli, _, err := u.client()
	return err == nil && mcp.IsModernProtocol(cli.ProtocolVersion())
}

// subscribed counts a subscription on the sandbox's session, which then outlives idleness.
func (l *lease) subscribed(delta int) {
	if l.conn == nil {
		return
	}
	l.u.pool.mu.Lock()
	l.conn.subs = max(l.conn.subs+delta, 0)
	l.u.pool.mu.Unlock()
}
