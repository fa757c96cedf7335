package httpconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/call"
)

// Serve serves every connection ln accepts until ctx ends or ln fails, then shuts down as
// net/http's server does: it stops accepting, closes the connections waiting for a request, lets
// those serving one finish it for up to grace, then cuts the rest: their requests' contexts are
// cancelled with cause call.ErrShutdown (so that each call's event says so), their connections
// closed, and Serve waits up to cutWait for their handlers to return, then says how many
// connections there were. A connection a handler took over (a CONNECT tunnel) leaves the set:
// its new owner ends it.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	s.prepare()
	cs := &connSet{conns: map[*conn]bool{}, cut: s.cut}
	errc := make(chan error, 1)
	go func() {
		errc <- accept(ln, func(nc net.Conn) {
			c := s.newConn(s.wrap(nc))
			c.set = cs
			if !cs.add(c) {
				_ = nc.Close()
				return
			}
			c.run(false)
		})
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	_ = ln.Close()
	<-errc
	return cs.shutdown(grace)
}

// ErrGraceOver says Serve closed connections whose requests had not finished within grace.
var ErrGraceOver = errors.New("shutdown grace over")

// connSet is a listener's connections, and whether each waits for a request (idle).
type connSet struct {
	mu      sync.Mutex
	conns   map[*conn]bool
	closing bool
	wg      sync.WaitGroup
	cut     context.CancelCauseFunc // cancels every request's context
}

// cutWait bounds the wait for the handlers of cut requests to return: their contexts are
// cancelled and their connections closed, so they have only their event left to write.
var cutWait = 500 * time.Millisecond

// add tracks a new connection; false once the set is shutting down.
func (cs *connSet) add(c *conn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closing {
		return false
	}
	cs.conns[c] = true
	cs.wg.Add(1)
	return true
}

// remove forgets a connection that was served to its end.
func (cs *connSet) remove(c *conn) {
	cs.mu.Lock()
	_, ok := cs.conns[c]
	delete(cs.conns, c)
	cs.mu.Unlock()
	if ok {
		cs.wg.Done()
	}
}

// idle records whether c waits for a request, and reports whether c may go on: false once the
// set is shutting down. A nil set (ServeConn's) always goes on.
func (cs *connSet) idle(c *conn, idle bool) bool {
	if cs == nil {
		return true
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if _, ok := cs.conns[c]; ok {
		cs.conns[c] = idle
	}
	return !cs.closing
}

// hijacked forgets a connection its handler took over.
func (cs *connSet) hijacked(c *conn) {
	if cs != nil {
		cs.remove(c)
	}
}

// shutdown closes the idle connections and waits up to wait for the others to finish their
// request; then it cuts what is left (see Serve) and says so.
func (cs *connSet) shutdown(wait time.Duration) error {
	cs.mu.Lock()
	cs.closing = true
	for c, idle := range cs.conns {
		if idle {
			_ = c.g.Close()
		}
	}
	cs.mu.Unlock()
	done := make(chan struct{})
	go func() { cs.wg.Wait(); close(done) }()
	grace := time.NewTimer(wait)
	defer grace.Stop()
	select {
	case <-done:
		return nil
	case <-grace.C:
	}
	cs.cut(call.ErrShutdown)
	cs.mu.Lock()
	n := len(cs.conns)
	for c := range cs.conns {
		_ = c.g.Close()
	}
	cs.mu.Unlock()
	handlers := time.NewTimer(cutWait)
	defer handlers.Stop()
	select {
	case <-done:
	case <-handlers.C:
	}
	return fmt.Errorf("%w: %d connections still serving a request after %s were cut", ErrGraceOver, n, wait)
}

// acceptRetry reports an Accept error worth waiting out (descriptors or memory running short, a
// connection aborted before it was accepted), as net/http's server retries them.
func acceptRetry(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED)
}

// accept serves every connection of ln on a goroutine of its own until ln fails or closes.
func accept(ln net.Listener, serve func(c net.Conn)) error {
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if acceptRetry(err) {
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			return err
		}
		backoff = 5 * time.Millisecond
		go serve(c)
	}
}
