package proxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// connSet is the proxy listener's connections, for a graceful shutdown as net/http's server
// does it: stop accepting, close the connections waiting for a request, let those serving one
// finish it (up to a deadline), then close the rest. A connection a handler took over (a
// CONNECT tunnel) leaves the set: Proxy.Close ends tunnels.
type connSet struct {
	mu      sync.Mutex
	conns   map[*connServer]bool // value: waiting for a request (idle)
	closing bool
	wg      sync.WaitGroup
}

func newConnSet() *connSet { return &connSet{conns: map[*connServer]bool{}} }

// add tracks a new connection; false once the set is shutting down.
func (cs *connSet) add(s *connServer) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closing {
		return false
	}
	cs.conns[s] = true
	cs.wg.Add(1)
	return true
}

// remove forgets a connection that was served to its end.
func (cs *connSet) remove(s *connServer) {
	cs.mu.Lock()
	_, ok := cs.conns[s]
	delete(cs.conns, s)
	cs.mu.Unlock()
	if ok {
		cs.wg.Done()
	}
}

// idle records whether s waits for a request, and reports whether s may go on: false once the
// set is shutting down. A nil set (a tunnel's) always goes on.
func (cs *connSet) idle(s *connServer, idle bool) bool {
	if cs == nil {
		return true
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if _, ok := cs.conns[s]; ok {
		cs.conns[s] = idle
	}
	return !cs.closing
}

// hijacked forgets a connection its handler took over.
func (cs *connSet) hijacked(s *connServer) {
	if cs != nil {
		cs.remove(s)
	}
}

// shutdown closes the idle connections and waits up to wait for the others to finish their
// request; then it closes what is left and says so.
func (cs *connSet) shutdown(wait time.Duration) error {
	cs.mu.Lock()
	cs.closing = true
	for s, idle := range cs.conns {
		if idle {
			_ = s.g.Close()
		}
	}
	cs.mu.Unlock()
	done := make(chan struct{})
	go func() { cs.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(wait):
	}
	cs.mu.Lock()
	n := len(cs.conns)
	for s := range cs.conns {
		_ = s.g.Close()
	}
	cs.mu.Unlock()
	return fmt.Errorf("%d connections still serving a request after %s were closed", n, wait)
}

// acceptRetry reports an Accept error worth waiting out (descriptors or memory running short, a
// connection aborted before it was accepted), as net/http's server retries them.
func acceptRetry(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED)
}

// accept serves every connection of ln on a goroutine of its own until ln fails or closes.
func (cs *connSet) accept(ln net.Listener, serve func(c net.Conn)) error {
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
