package httpconn

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
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

// earlyAnswerServer answers before it has read the request body: /limit reads 1 KiB of it at
// most and answers 413 (a body over the limit), /close reads nothing and answers with
// Connection: close (a refusal that ends the connection).
func earlyAnswerServer(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/limit", func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1024))
		require.Error(t, err)
		http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		http.Error(w, "refused", http.StatusForbidden)
	})
	srv := &Server{Handler: mux, MaxHeaderBytes: 4096, HeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		Flagged: func(w http.ResponseWriter, r *http.Request, rf *call.Refusal) { http.Error(w, rf.Reason, rf.Status()) },
		Reject:  func(_ net.Conn, rf *call.Refusal) *call.Refusal { return rf },
		Refusal: func(rf *call.Refusal) *http.Response {
			return &http.Response{StatusCode: rf.Status(), ProtoMajor: 1, ProtoMinor: 1, Close: true, Body: http.NoBody}
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, 5*time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// TestAnAnswerGivenBeforeTheBodyReachesTheClient: a client that sends its whole 10 MB body
// before it reads anything (Python's http.client does) gets the answer the server gave after
// reading a kilobyte, or none of it, and then the connection's clean end, not a reset: with a
// Content-Length (the answer says Connection: close) and chunked.
func TestAnAnswerGivenBeforeTheBodyReachesTheClient(t *testing.T) {
	addr := earlyAnswerServer(t)
	body := bytes.Repeat([]byte("x"), 10<<20)
	for _, tc := range []struct {
		path    string
		chunked bool
		status  int
	}{
		{"/limit", false, http.StatusRequestEntityTooLarge},
		{"/limit", true, http.StatusRequestEntityTooLarge},
		{"/close", false, http.StatusForbidden},
		{"/close", true, http.StatusForbidden},
	} {
		t.Run(fmt.Sprintf("%s, chunked %v", tc.path, tc.chunked), func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+tc.path, io.MultiReader(bytes.NewReader(body)))
			require.NoError(t, err)
			if !tc.chunked {
				req.ContentLength = int64(len(body))
			}
			require.NoError(t, req.Write(c), "the whole body went out")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, req)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, tc.status, resp.StatusCode, "%s", b)
			if !tc.chunked {
				assert.True(t, resp.Close, "a body left unread past the drain ends the connection, and the answer says so")
			}
			_, err = br.ReadByte()
			assert.ErrorIs(t, err, io.EOF, "then the connection ends cleanly")
		})
	}
}

// TestLingerIsBounded: a client that never stops sending after an early answer is not read
// for ever: after lingerBytes the connection closes, and the answer was there to read.
func TestLingerIsBounded(t *testing.T) {
	addr := earlyAnswerServer(t)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	_, err = io.WriteString(c, "POST /limit HTTP/1.1\r\nHost: x\r\nContent-Length: 1099511627776\r\n\r\n")
	require.NoError(t, err)
	var (
		wg     sync.WaitGroup
		status string
	)
	wg.Go(func() {
		line, _ := bufio.NewReader(c).ReadString('\n')
		status = strings.TrimSpace(line)
	})
	chunk := make([]byte, 1<<20)
	var sent int64
	for sent < 1<<30 {
		n, err := c.Write(chunk)
		sent += int64(n)
		if err != nil {
			break
		}
	}
	wg.Wait()
	assert.Equal(t, "HTTP/1.1 413 Request Entity Too Large", status)
	assert.Greater(t, sent, int64(lingerBytes), "the server read on after its answer, up to lingerBytes")
	assert.Less(t, sent, int64(lingerBytes+32<<20), "and stopped there (give or take the buffers between)")
}
