package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// An upstream session's listening stream that drops mid-way is opened again, after a backoff,
// with the Last-Event-ID of the last event Sandgate received; the events after it reach the
// sandbox once each, in order (issue 35: the listening stream resumes like a call's stream).
func TestListeningStreamResumesAfterTheLastEventReceived(t *testing.T) {
	up := &droppingListener{rawUpstream: startRawUpstream(t, "testdata/rich-catalog.json"), perConn: 2,
		events: []string{"1", "2", "3", "4", "5"}, finish: make(chan struct{})}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: srv.URL + "/mcp", Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.call("logging/setLevel", map[string]any{"level": "debug"})
	listening := openListeningStream(t, s)
	s.call("tools/call", map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"}}) // opens its upstream session

	logs := func() []string {
		var out []string
		for _, n := range listening.messages(string(mcp.MethodNotificationMessage)) {
			out = append(out, fmt.Sprint(n.Params["data"]))
		}
		return out
	}
	require.Eventually(t, func() bool { return len(logs()) >= len(up.events) }, 15*time.Second, 10*time.Millisecond,
		"every event of the dropping stream reaches the sandbox")
	close(up.finish) // the upstream sends a last event; every message before it is in once it is
	require.Eventually(t, func() bool { return len(logs()) > len(up.events) }, 15*time.Second, 10*time.Millisecond)
	assert.Equal(t, []string{"1", "2", "3", "4", "5", "end"}, logs(), "each event once, in the upstream's order")

	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Equal(t, []string{"", "e2", "e4"}, up.lastIDs, "each reconnection names the last event received")
	for i, at := range up.dropped {
		assert.GreaterOrEqual(t, up.asked[i+1].Sub(at), backoffMin/2, "reconnection %d waits its backoff", i+1)
	}
}

// droppingListener is a raw upstream whose sandbox sessions' listening streams (every GET but
// the shared session's, which it refuses) send the events after the Last-Event-ID they carry,
// perConn at most, each with its ID ("e1", "e2", …), then drop the connection mid-event. The
// stream that sends the last events stays open; closing finish makes it send one more ("end").
type droppingListener struct {
	*rawUpstream
	events  []string
	perConn int
	finish  chan struct{}

	mu      sync.Mutex
	lastIDs []string    // the Last-Event-ID of each GET
	asked   []time.Time // when each GET came
	dropped []time.Time // when each dropped stream was cut
}

func (d *droppingListener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.Header.Get("Mcp-Session-Id") == "raw-session-1" {
		d.serve(w, r) // the shared session has no listening stream (405)
		return
	}
	last := r.Header.Get("Last-Event-ID")
	d.mu.Lock()
	d.lastIDs, d.asked = append(d.lastIDs, last), append(d.asked, time.Now())
	d.mu.Unlock()
	from := 0
	if last != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(last, "e"))
		if err != nil || n > len(d.events) {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		from = n
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(id, data string) {
		fmt.Fprintf(w, "id: %s\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":%q}}\n\n", id, data)
		w.(http.Flusher).Flush()
	}
	to := min(from+d.perConn, len(d.events))
	for i := from; i < to; i++ {
		send("e"+strconv.Itoa(i+1), d.events[i])
	}
	if to < len(d.events) {
		_, _ = fmt.Fprint(w, "id: cut\ndata: {\"jsonrpc\":")
		w.(http.Flusher).Flush()
		d.mu.Lock()
		d.dropped = append(d.dropped, time.Now())
		d.mu.Unlock()
		panic(http.ErrAbortHandler) // the connection drops inside an event
	}
	select {
	case <-d.finish:
		send("e"+strconv.Itoa(len(d.events)+1), "end")
	case <-r.Context().Done():
		return
	}
	<-r.Context().Done()
}
