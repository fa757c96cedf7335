package headguard

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/call"
)

// testServer serves on a loopback listener: /hello answers "hello", /deny answers 403 as a
// handler's refusal does, /until-released waits for release. Every head refused before a
// request exists is sent on rejected, every flagged one on flagged.
type testServer struct {
	addr     string
	stop     func() error // shuts the server down (also done at the test's end)
	release  chan struct{}
	entered  chan struct{}
	rejected chan string
	flagged  chan string
}

func newTestServer(t *testing.T, headerTimeout time.Duration) *testServer {
	t.Helper()
	ts := &testServer{release: make(chan struct{}, 1), entered: make(chan struct{}, 1),
		rejected: make(chan string, 16), flagged: make(chan string, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello") })
	mux.HandleFunc("/deny", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "denied", http.StatusForbidden) })
	mux.HandleFunc("/until-released", func(w http.ResponseWriter, r *http.Request) {
		ts.entered <- struct{}{}
		<-ts.release
		_, _ = io.WriteString(w, "released")
	})
	srv := &Server{Handler: mux, MaxHeaderBytes: 4096, HeaderTimeout: headerTimeout, IdleTimeout: time.Minute,
		Flagged: func(w http.ResponseWriter, r *http.Request, rf *call.Refusal) {
			ts.flagged <- rf.Code
			w.Header().Set("Connection", "close")
			http.Error(w, "refused: "+rf.Code, rf.Status())
		},
		Reject: func(c net.Conn, rf *call.Refusal) { ts.rejected <- rf.Code },
		Refusal: func(rf *call.Refusal) *http.Response {
			body := "refused: " + rf.Code
			return &http.Response{StatusCode: rf.Status(), ProtoMajor: 1, ProtoMinor: 1, Close: true,
				Header: http.Header{"Content-Type": {"application/json"}},
				Body:   io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body))}
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

func (ts *testServer) dial(t *testing.T) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", ts.addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn), bufio.NewReader(c)
}

func readResponse(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// TestHeadsNetHTTPRefusesAreSandgates sends heads that net/http's server refuses by itself,
// with its own plain-text answer: each is answered with Sandgate's refusal instead and audited
// exactly once, and the connection closes.
func TestHeadsNetHTTPRefusesAreSandgates(t *testing.T) {
	ts := newTestServer(t, 10*time.Second)
	for _, tc := range []struct {
		name, raw string
		status    int
		code      string
	}{
		{"a bad request line", "GET\r\n\r\n", 400, call.CodeMalformedRequest},
		{"a header line without a colon", "GET /hello HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", 400, call.CodeMalformedRequest},
		{"HTTP/0.9", "GET /\r\n\r\n", 400, call.CodeMalformedRequest},
		{"HTTP/2 in an HTTP/1.1 connection (net/http: 505)", "GET /hello HTTP/2.0\r\nHost: x\r\n\r\n", 400, call.CodeMalformedRequest},
		{"no Host", "GET /hello HTTP/1.1\r\n\r\n", 400, call.CodeMalformedRequest},
		{"an invalid header name", "GET /hello HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", 400, call.CodeMalformedRequest},
		{"two different Content-Lengths", "POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, call.CodeMalformedRequest},
		{"an Expect other than 100-continue (net/http: 417)", "GET /hello HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\n\r\n", 400, call.CodeMalformedRequest},
		{"an unsupported Transfer-Encoding (net/http: 501)", "POST /hello HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, call.CodeMalformedRequest},
		{"Content-Length beside an unsupported Transfer-Encoding (flagged, then refused by net/http)", "POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: gzip\r\n\r\nabc", 400, call.CodeMalformedRequest},
		{"a head past what net/http reads (net/http: 431)", "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 20000) + "\r\n\r\n", 431, call.CodeHeaderTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := ts.dial(t)
			_, err := io.WriteString(c, tc.raw)
			require.NoError(t, err)
			resp, body := readResponse(t, br)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Equal(t, "refused: "+tc.code, body, "Sandgate's answer, not net/http's text")
			assert.Equal(t, tc.code, <-ts.rejected)
			_, err = br.ReadByte()
			assert.Error(t, err, "the connection closes")
			assert.Empty(t, ts.rejected, "one head, one event")
			assert.Empty(t, ts.flagged)
		})
	}
}

// TestFlaggedHeadsReachFlagged sends heads net/http would serve but Sandgate refuses: Flagged
// answers them (nothing is audited as a head refused before a request).
func TestFlaggedHeadsReachFlagged(t *testing.T) {
	ts := newTestServer(t, 10*time.Second)
	for _, tc := range []struct{ name, raw, code string }{
		{"Content-Length and Transfer-Encoding", "POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", call.CodeRequestSmuggling},
		{"obsolete line folding", "GET /hello HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\n\r\n", call.CodeMalformedRequest},
		{"a head over the limit that net/http still reads", "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 5000) + "\r\n\r\n", call.CodeHeaderTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := ts.dial(t)
			_, err := io.WriteString(c, tc.raw)
			require.NoError(t, err)
			_, body := readResponse(t, br)
			assert.Contains(t, body, "refused: "+tc.code)
			assert.Equal(t, tc.code, <-ts.flagged)
			assert.Empty(t, ts.rejected)
		})
	}
}

// TestHandlerRefusalBeforeAPipelinedHead answers a request with a handler's 403 while the next
// request is already read: the 403 is the handler's, passed on as written, and the next request
// is served.
func TestHandlerRefusalBeforeAPipelinedHead(t *testing.T) {
	ts := newTestServer(t, 10*time.Second)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /deny HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, body := readResponse(t, br)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, "denied\n", body)
	resp, body = readResponse(t, br)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "hello", body)
	assert.Empty(t, ts.rejected)
}

// TestHeadCutShortIsAuditedOnce closes the client's side in the middle of a head: one event,
// no answer.
func TestHeadCutShortIsAuditedOnce(t *testing.T) {
	ts := newTestServer(t, 10*time.Second)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /hello HTTP/1.1\r\nHost: x")
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	assert.Equal(t, call.CodeMalformedRequest, <-ts.rejected)
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "closed without an answer")
	assert.Empty(t, ts.rejected)
}

// TestHeadTooSlowIsAuditedOnce lets a head stop arriving: the header timeout closes the
// connection without an answer, with one event.
func TestHeadTooSlowIsAuditedOnce(t *testing.T) {
	ts := newTestServer(t, 200*time.Millisecond)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /hello HTTP/1.1\r\nHost: x")
	require.NoError(t, err)
	select {
	case code := <-ts.rejected:
		assert.Equal(t, call.CodeHeaderTimeout, code)
	case <-time.After(30 * time.Second):
		t.Fatal("no event for a head cut by the header timeout")
	}
	_, err = br.ReadByte()
	assert.Error(t, err)
	assert.Empty(t, ts.rejected)
}

// TestRequestsAfterALongHandlerAreNotRefused keeps a handler running while net/http's own
// background read waits, then serves the next request: ending that read (a deadline in the
// past) is no header timeout.
func TestRequestsAfterALongHandlerAreNotRefused(t *testing.T) {
	ts := newTestServer(t, 10*time.Second)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /until-released HTTP/1.1\r\nHost: x\r\n\r\nGET /hel")
	require.NoError(t, err)
	<-ts.entered
	ts.release <- struct{}{}
	_, body := readResponse(t, br)
	assert.Equal(t, "released", body)
	_, err = io.WriteString(c, "lo HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	_, body = readResponse(t, br)
	assert.Equal(t, "hello", body)
	assert.Empty(t, ts.rejected)
}

// TestShutdownClosesAnIdleConnection shuts the server down while a connection waits for its
// next request: the connection is closed at once, and Serve returns without waiting for the
// grace period.
func TestShutdownClosesAnIdleConnection(t *testing.T) {
	ts := newTestServer(t, 10*time.Second)
	c, br := ts.dial(t)
	_, err := io.WriteString(c, "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	_, body := readResponse(t, br)
	assert.Equal(t, "hello", body)
	require.NoError(t, ts.stop(), "an idle connection does not hold the shutdown for its grace")
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the idle connection was closed")
}

// TestServeConnCallsClosedOnce serves one handed-over connection: closed is called once, when
// the client goes away.
func TestServeConnCallsClosedOnce(t *testing.T) {
	client, server := net.Pipe()
	closed := make(chan struct{}, 2)
	srv := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hi") }),
		MaxHeaderBytes: 4096, HeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	srv.ServeConn(server, func() { closed <- struct{}{} })
	br := bufio.NewReader(client)
	_, err := io.WriteString(client, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	_, body := readResponse(t, br)
	assert.Equal(t, "hi", body)
	require.NoError(t, client.Close())
	<-closed
	assert.Empty(t, closed)
}
