package httpconn

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/call"
)

// testServer serves on a loopback listener: /hello answers "hello", /until-released waits for
// release. Every head refused before a request exists is sent on rejected.
type testServer struct {
	addr     string
	stop     func() error // shuts the server down (also done at the test's end)
	release  chan struct{}
	entered  chan struct{}
	rejected chan string
}

func newTestServer(t *testing.T) *testServer {
	t.Helper()
	ts := &testServer{release: make(chan struct{}, 1), entered: make(chan struct{}, 1), rejected: make(chan string, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") })
	mux.HandleFunc("/until-released", func(w http.ResponseWriter, r *http.Request) {
		ts.entered <- struct{}{}
		<-ts.release
		_, _ = io.WriteString(w, "released")
	})
	srv := &Server{Handler: mux, MaxHeaderBytes: 4096, HeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		Flagged: func(w http.ResponseWriter, r *http.Request, rf *call.Refusal) { http.Error(w, rf.Reason, rf.Status()) },
		Reject:  func(c net.Conn, rf *call.Refusal) *call.Refusal { ts.rejected <- rf.Code; return rf },
		Refusal: func(rf *call.Refusal) *http.Response {
			return &http.Response{StatusCode: rf.Status(), ProtoMajor: 1, ProtoMinor: 1, Close: true,
				Body: io.NopCloser(strings.NewReader(rf.Reason)), ContentLength: int64(len(rf.Reason))}
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ts.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, 5*time.Second) }()
	ts.stop = sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() { assert.NoError(t, ts.stop()) })
	return ts
}

func (ts *testServer) dial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", ts.addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

func readBody(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "body %q", b)
	return string(b)
}

// TestWatchKeepsAPipelinedRequest sends the next request while the first one is watched: the
// byte the watch read is the next request's first, and both are answered in order.
func TestWatchKeepsAPipelinedRequest(t *testing.T) {
	started := make(chan struct{}, 1)
	watchStarted = func() { started <- struct{}{} }
	t.Cleanup(func() { watchStarted = nil })
	ts := newTestServer(t)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /until-released HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	<-ts.entered
	<-started
	_, err = io.WriteString(c, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	ts.release <- struct{}{}
	assert.Equal(t, "released", readBody(t, br))
	assert.Equal(t, "hello", readBody(t, br))
}

// releaseAtOnce makes a connection give its read buffer back a millisecond after a request, and
// reports each time one does.
func releaseAtOnce(t *testing.T) <-chan struct{} {
	released := make(chan struct{}, 4)
	saved := idleBuffer
	idleBuffer, readerReleased = time.Millisecond, func() { released <- struct{}{} }
	t.Cleanup(func() { idleBuffer, readerReleased = saved, nil })
	return released
}

// TestIdleConnectionGivesBackItsReadBuffer lets a kept-alive connection idle past idleBuffer: it
// gives its read buffer back, and its next requests (one whose first byte arrives alone, one
// pipelined behind it) are read whole, with nothing refused.
func TestIdleConnectionGivesBackItsReadBuffer(t *testing.T) {
	released := releaseAtOnce(t)
	ts := newTestServer(t)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	assert.Equal(t, "hello", readBody(t, br))
	<-released
	_, err = io.WriteString(c, "G")
	require.NoError(t, err)
	_, err = io.WriteString(c, "ET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	assert.Equal(t, "hello", readBody(t, br))
	assert.Equal(t, "hello", readBody(t, br))
	<-released
	_, err = io.WriteString(c, "GET /hello HTTP/1.1\r\n\x00bad\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, call.CodeMalformedRequest, <-ts.rejected)
	assert.Empty(t, ts.rejected, "one head, one refusal")
}

// TestShutdownClosesAnIdleConnection shuts the server down while a connection waits for its
// next request with no buffer (on the goroutine that took over the wait): the connection is
// closed at once, and Serve returns without waiting for the grace period.
func TestShutdownClosesAnIdleConnection(t *testing.T) {
	released := releaseAtOnce(t)
	ts := newTestServer(t)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	assert.Equal(t, "hello", readBody(t, br))
	<-released
	require.NoError(t, ts.stop(), "an idle connection does not hold the shutdown for its grace")
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the idle connection was closed")
}

// TestBusyConnectionKeepsItsStack: a connection waiting for its next request within idleBuffer
// keeps the stack its requests grew, through garbage collections. The handler reports the
// address of a variable in its own frame; a stack the collector shrank was copied to a new one
// (while the old one was still in use, so at another address) and the next request would find
// its frame elsewhere.
func TestBusyConnectionKeepsItsStack(t *testing.T) {
	saved := idleBuffer
	idleBuffer = time.Minute // no hand-off to a fresh goroutine during the test, however slow
	t.Cleanup(func() { idleBuffer = saved })
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // only the collections the test asks for

	frames := make(chan uintptr, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var here byte
		frames <- uintptr(unsafe.Pointer(&here))
		if r.URL.Path == "/deep" {
			deepStack(24) // a request that grows the stack to 32 KiB, as a policy evaluation does
		}
	})
	srv := &Server{Handler: mux, MaxHeaderBytes: 4096, HeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, 5*time.Second) }()
	defer func() { cancel(); assert.NoError(t, <-done) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	get := func(path string) uintptr {
		_, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		return <-frames
	}
	get("/deep")
	before := get("/")
	runtime.GC()
	runtime.GC()
	assert.Equal(t, before, get("/"), "the connection's stack was shrunk while it waited for its next request")
}

//go:noinline
func deepStack(n int) byte {
	var frame [1024]byte
	frame[n%1024] = byte(n)
	if n > 0 {
		return deepStack(n-1) + frame[(n*7)%1024]
	}
	return frame[0]
}
