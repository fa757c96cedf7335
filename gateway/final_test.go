package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
)

// gatedSink is a real file sink whose writes of one kind of event wait for open: a disk that
// is slow for the call under test.
type gatedSink struct {
	*audit.FileSink
	kind    audit.Kind
	reached chan struct{}
	open    chan struct{}
}

func (s *gatedSink) WriteBatch(b *audit.Batch) error {
	for _, ev := range b.Events {
		if ev.Kind == s.kind {
			s.reached <- struct{}{}
			<-s.open
			break
		}
	}
	return s.FileSink.WriteBatch(b)
}

// TestSSEResponseEndsOnlyOnceItsEventIsWritten: a tools/call answered in an SSE stream (its
// progress notification first) with blocking delivery. The notification reaches the sandbox at
// once; no byte of the JSON-RPC response goes out while the call's event is still being
// written, and the response completes as soon as it is.
//
// The response guard holds back what could begin a credential; when the result's text ends in a
// credential's first bytes, it passes the response event on in two writes, and the response
// stays held all the same.
func TestSSEResponseEndsOnlyOnceItsEventIsWritten(t *testing.T) {
	for name, then := range map[string]string{"whole": "", "split by the response guard": " " + upstreamSecret[:8]} {
		t.Run(name, func(t *testing.T) { testSSEResponseHeld(t, then) })
	}
}

// testSSEResponseHeld runs TestSSEResponseEndsOnlyOnceItsEventIsWritten with a result text of
// "done" and then.
func testSSEResponseHeld(t *testing.T, then string) {
	upURL := startChattyUpstream(t, 1)
	fs, err := audit.OpenFileSink(audit.FileConfig{Dir: t.TempDir(), Fsync: audit.FsyncNever})
	require.NoError(t, err)
	sink := &gatedSink{FileSink: fs, kind: audit.KindToolsCall, reached: make(chan struct{}, 1), open: make(chan struct{})}
	w := audit.NewWriter(sink, audit.WithDelivery(audit.DeliveryBlocking))
	openGate := sync.OnceFunc(func() { close(sink.open) })
	t.Cleanup(func() { openGate(); _ = w.Close(context.Background()) })
	// The legacy revision streams with mcp-go's event store (as TestNotificationsKeepTheSandboxTokenAndPrecedeTheResult).
	h := startGatewayWith(t, "testdata/policy", func(o *Options) { o.Audit = w },
		config.Upstream{Name: "http", URL: upURL, ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.call("logging/setLevel", map[string]any{"level": "debug"})
	sid := s.sid

	conn, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).Dial("tcp", h.addr)
	require.NoError(t, err)
	defer conn.Close()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"chatty","arguments":{"then":%q},"_meta":{"progressToken":"p1"}}}`, then)
	_, err = fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nMcp-Session-Id: %s\r\nContent-Length: %d\r\n\r\n%s", sid, len(body), body)
	require.NoError(t, err)
	<-sink.reached // the call's event is being written, and waits

	br := bufio.NewReader(conn)
	var early []byte
	for !bytes.Contains(early, []byte("notifications/progress")) { // the notification arrives, unheld
		b, err := br.ReadByte()
		require.NoError(t, err, "read so far: %q", early)
		early = append(early, b)
	}
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	more, err := io.ReadAll(br)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "the stream ended early: %v", err)
	early = append(early, more...)
	assert.False(t, bytes.Contains(early, []byte(`"result"`)), "the response began before its event was written: %q", early)

	require.NoError(t, conn.SetReadDeadline(time.Time{}))
	openGate()
	resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(early), br)), nil)
	require.NoError(t, err)
	all, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "the stream completes once the event is written")
	var last string
	for _, line := range strings.Split(string(all), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			last = d
		}
	}
	assert.Contains(t, last, `"text":"done`)
	assert.Contains(t, last, `"id":7`)
}
