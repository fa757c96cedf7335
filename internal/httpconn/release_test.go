package httpconn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/policy"
)

type allowAll struct{}

func (allowAll) Decide(context.Context, *policy.Input) policy.Decision {
	return policy.Decision{Allow: true, Revision: "r1"}
}
func (allowAll) Revision() string { return "r1" }

// blockingCore is a request path whose events a real blocking audit writer writes to dir.
func blockingCore(t *testing.T, dir string, opts ...audit.Option) (*call.Core, *audit.Writer) {
	t.Helper()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: dir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	w := audit.NewWriter(sink, append([]audit.Option{audit.WithDelivery(audit.DeliveryBlocking)}, opts...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // a failing sink gives up
		defer cancel()
		_ = w.Close(ctx)
	})
	core, err := call.New(call.Options{Policy: allowAll{}, Audit: w})
	require.NoError(t, err)
	return core, w
}

// serveHandler serves h on a loopback listener for the test.
func serveHandler(t *testing.T, h http.Handler, grace time.Duration) (addr string, stop func() error) {
	t.Helper()
	srv := &Server{Handler: h, MaxHeaderBytes: 4096, HeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		Flagged: func(w http.ResponseWriter, r *http.Request, rf *call.Refusal) {}, Reject: func(_ net.Conn, rf *call.Refusal) *call.Refusal { return rf },
		Refusal: func(rf *call.Refusal) *http.Response {
			return &http.Response{StatusCode: 400, ProtoMajor: 1, ProtoMinor: 1, Body: http.NoBody}
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, grace) }()
	var stopped bool
	var result error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			result = <-done
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return ln.Addr().String(), stop
}

// answered runs r's call: write answers it, and the call ends answered.
func answered(core *call.Core, r *http.Request, write func()) {
	call.Run(r.Context(), core, call.Spec{Kind: audit.KindHTTPRequest}, call.Steps[struct{}]{
		Ask: func(context.Context, *call.Call) (call.Question, *call.Refusal) { return call.Question{}, nil },
		Act: func(context.Context, *call.Call, call.Grant) (struct{}, call.End) {
			write()
			return struct{}{}, call.Answered(http.StatusOK)
		},
		Refused: func(*call.Refusal) struct{} { return struct{}{} },
	})
}

// TestHeldAnswerCompletesAfterItsEventIsWritten: with blocking delivery, the end of a body (its
// closing bracket, the last byte of its Content-Length, its last chunk) reaches the client only
// once the handler has finished its call, that is once its event is in the file. The body is
// written in one write larger than two buffers, which the buffer passes straight on.
func TestHeldAnswerCompletesAfterItsEventIsWritten(t *testing.T) {
	core, _ := blockingCore(t, t.TempDir())
	body := strings.Repeat(" ", 10000) + `{"a":1}` + "\n"
	written, finish := make(chan struct{}), make(chan struct{})
	addr, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answered(core, r, func() {
			if r.URL.Path == "/length" {
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			}
			_, _ = io.WriteString(w, body)
			written <- struct{}{}
			<-finish
		})
	}), 5*time.Second)

	for _, tc := range []struct{ path, end string }{{"/length", "}\n"}, {"/chunked", "0\r\n\r\n"}} {
		t.Run(tc.path, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			br := bufio.NewReader(c)
			_, err = io.WriteString(c, "GET "+tc.path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			require.NoError(t, err)
			<-written
			// What went out can be read; the closing bracket never comes early. The bytes are
			// read raw: an HTTP body reader keeps a timeout for good.
			require.NoError(t, c.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
			early, err := io.ReadAll(br)
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout(), "the connection ended early: %v", err)
			assert.Greater(t, len(early), 4096, "most of the body is on its way")
			assert.False(t, bytes.Contains(early, []byte("}")), "the closing bracket arrived before the event was written")
			require.NoError(t, c.SetReadDeadline(time.Time{}))
			finish <- struct{}{}
			all := early
			for !bytes.HasSuffix(all, []byte(tc.end)) {
				b, err := br.ReadByte()
				require.NoError(t, err, "the answer completes")
				all = append(all, b)
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(all)), nil)
			require.NoError(t, err)
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, body, string(got))
		})
	}
}

// TestFlushSendsAStreamAtOnce: holding never delays what a handler flushes (an SSE event).
func TestFlushSendsAStreamAtOnce(t *testing.T) {
	core, _ := blockingCore(t, t.TempDir())
	finish := make(chan struct{})
	addr, _ := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answered(core, r, func() {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-finish
		})
	}), 5*time.Second)
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: one\n", line, "the flushed event arrived while the handler runs")
	close(finish)
}

// TestAnswerIsCutWhenItsEventIsNotWritten: the audit log cannot be written (its file was
// removed), the blocking write is not confirmed within the delivery timeout, and the client
// gets no complete answer: the connection closes before the end of the body.
func TestAnswerIsCutWhenItsEventIsNotWritten(t *testing.T) {
	dir := t.TempDir()
	core, w := blockingCore(t, dir, audit.WithDeliveryTimeout(50*time.Millisecond), audit.WithRetryBackoff(10*time.Millisecond))
	require.NoError(t, os.Remove(dir+"/"+audit.ActiveFile))
	addr, _ := serveHandler(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		answered(core, r, func() {
			rw.Header().Set("Content-Length", "5")
			_, _ = io.WriteString(rw, "hello")
		})
	}), 5*time.Second)
	resp, err := http.Get("http://" + addr + "/")
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Error(t, rerr, "the body must not complete; got %q", b)
		assert.Less(t, len(b), 5)
	}
	assert.Equal(t, uint64(1), w.Stats().Undelivered)
}

// TestCutRequestsSeeTheShutdownCause: a request still running when the drain is over has its
// context cancelled with call.ErrShutdown, and Serve returns after its handler did.
func TestCutRequestsSeeTheShutdownCause(t *testing.T) {
	entered, causes := make(chan struct{}), make(chan error, 1)
	addr, stop := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
		causes <- context.Cause(r.Context())
	}), 50*time.Millisecond)
	go func() {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	err := stop()
	require.ErrorIs(t, err, ErrGraceOver)
	select {
	case cause := <-causes:
		assert.ErrorIs(t, cause, call.ErrShutdown)
	default:
		t.Fatal("Serve returned before the cut handler did")
	}
}
