// Package mcpstdio is mcp-go's stdio client transport on pipes Sandgate made, so that a
// server's output is read line by line, bounded: mcp-go's own command transport reads lines of
// any length, and hands a notification over decoded (its parameters' key order lost), with
// nothing that says which call it came with. Here a notification is handed over as the
// server wrote it, in the order of the output, and a request to the client is kept as written.
package mcpstdio

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/respguard"
)

// Transport is one stdio server's connection. The process is started, and stopped, here as
// mcp-go would.
type Transport struct {
	*transport.Stdio
	cmd   func(ctx context.Context) (*exec.Cmd, error)
	proc  *exec.Cmd
	out   *lines
	outR  *os.File // Sandgate's end of the server's stdout
	outW  *os.File // the server's end
	inR   *os.File
	inW   *os.File
	start atomic.Bool
}

// Message reads what a line of the server's is: its method ("" for a response) and ID (nil
// for a notification).
type Message func(line []byte) (method string, id mcp.RequestId, err error)

// New is the transport of the server cmd makes, whose lines are at most maxLine bytes, each
// read by read.
func New(cmd func(ctx context.Context) (*exec.Cmd, error), maxLine int64, read Message) (*Transport, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdio pipe: %w", err)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("stdio pipe: %w", err)
	}
	s := &Transport{cmd: cmd, out: newLines(outR, maxLine, read), outR: outR, outW: outW, inR: inR, inW: inW}
	s.Stdio = transport.NewIO(s.out, inW, nil)
	return s, nil
}

// Start starts the server, then mcp-go's reading of it.
func (s *Transport) Start(ctx context.Context) error {
	if s.start.Swap(true) {
		return nil
	}
	cmd, err := s.cmd(ctx)
	if err != nil {
		return err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.inR, s.outW, io.Discard
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("failed to start command: %w", err)
	}
	s.proc = cmd
	s.inR.Close() // the server holds its ends now
	s.outW.Close()
	return s.Stdio.Start(ctx)
}

// stdioGrace is how long a server may take to exit once its stdin is closed, and then once
// it got SIGTERM, before it is killed (mcp-go's own timings).
const stdioGrace = 2 * time.Second

// Close closes the server's stdin and waits for it to exit, terminating it if it does not.
func (s *Transport) Close() error {
	err := s.Stdio.Close()
	if s.proc != nil {
		done := make(chan struct{})
		go func() { _ = s.proc.Wait(); close(done) }()
		exited := func() bool {
			select {
			case <-done:
				return true
			case <-time.After(stdioGrace):
				return false
			}
		}
		if !exited() {
			_ = s.proc.Process.Signal(syscall.SIGTERM)
			if !exited() {
				_ = s.proc.Process.Kill()
				<-done
			}
		}
	}
	s.outR.Close()
	return err
}

// Failure is why the server's output stopped being read (a line over the bound), nil if it
// did not.
func (s *Transport) Failure() error { return s.out.failure() }

// OnNotification hands each notification of the server's to f, as written, in the order of
// the output.
func (s *Transport) OnNotification(f func(raw []byte)) { s.out.notify.Store(&f) }

// Request is the request to the client with ID id as the server wrote it, once.
func (s *Transport) Request(id mcp.RequestId) ([]byte, bool) { return s.out.request(id) }

// lines passes a stdio server's output to mcp-go line by line, and fails at a line over
// max bytes. A notification is taken out and handed to notify, in the order of the output: one
// the server wrote before a response is handled before mcp-go reads that response. A request
// to the client is passed on (mcp-go answers it with the handler the gateway set) and kept as
// written (request) for that handler.
type lines struct {
	r    io.Reader
	max  int64
	read Message
	buf  []byte
	line []byte // the line read so far
	out  []byte // lines mcp-go has yet to read
	rerr error  // the read error after out

	notify atomic.Pointer[func(raw []byte)]

	mu       sync.Mutex
	requests map[string][]byte // requests to the client as written, by their ID's JSON

	err atomic.Pointer[error]
}

func newLines(r io.Reader, max int64, read Message) *lines {
	return &lines{r: r, max: max, read: read, buf: make([]byte, 32<<10), requests: map[string][]byte{}}
}

func (l *lines) Read(p []byte) (int, error) {
	for len(l.out) == 0 {
		if e := l.err.Load(); e != nil {
			return 0, *e
		}
		if l.rerr != nil {
			return 0, l.rerr
		}
		n, err := l.r.Read(l.buf)
		if ferr := l.feed(l.buf[:n]); ferr != nil {
			l.err.Store(&ferr)
			return 0, ferr
		}
		l.rerr = err
	}
	n := copy(p, l.out)
	l.out = l.out[:copy(l.out, l.out[n:])]
	return n, nil
}

// feed splits b into lines and handles each complete one.
func (l *lines) feed(b []byte) error {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i]
		}
		if int64(len(l.line)+len(chunk)) > l.max {
			return fmt.Errorf("%w: a stdio message over %d bytes", respguard.ErrTooLarge, l.max)
		}
		l.line = append(l.line, chunk...)
		if i < 0 {
			return nil
		}
		l.handle(bytes.TrimRight(l.line, "\r"))
		l.line = l.line[:0]
		b = b[i+1:]
	}
	return nil
}

// handle takes a notification out of the stream and keeps a request as written.
func (l *lines) handle(line []byte) {
	if method, id, err := l.read(line); err == nil && method != "" {
		if id.IsNil() {
			if h := l.notify.Load(); h != nil {
				(*h)(bytes.Clone(line))
			}
			return
		}
		if id, err := json.Marshal(id); err == nil {
			l.mu.Lock()
			l.requests[string(id)] = bytes.Clone(line)
			l.mu.Unlock()
		}
	}
	l.out = append(append(l.out, line...), '\n')
}

// request is the request to the client with ID id as the server wrote it, once.
func (l *lines) request(id mcp.RequestId) ([]byte, bool) {
	key, err := json.Marshal(id)
	if err != nil {
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	raw, ok := l.requests[string(key)]
	delete(l.requests, string(key))
	return raw, ok
}

func (l *lines) failure() error {
	if e := l.err.Load(); e != nil {
		return *e
	}
	return nil
}
