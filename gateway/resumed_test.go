package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/mcpsessions"
	"github.com/sandgate/sandgate/internal/sse"
	"github.com/sandgate/sandgate/test/redistest"
)

// rawEvent is one SSE event as the sandbox read it: its bytes on the wire (from its first field
// to its blank line, found with internal/sse), and its ID and data.
type rawEvent struct{ raw, id, data string }

// eventReader reads the SSE events of a response one at a time.
type eventReader struct {
	body io.Reader
	ps   sse.Parser
	buf  []byte // bytes read and not parsed yet
	seen []byte // bytes of the event being read
}

func newEventReader(resp *http.Response) *eventReader {
	return &eventReader{body: resp.Body, ps: sse.Parser{Max: 1 << 20}}
}

// next is the next event; ok false when the stream ended first.
func (r *eventReader) next() (ev rawEvent, ok bool) {
	for {
		if len(r.buf) > 0 {
			n, err := r.ps.Feed(r.buf, func(e sse.Event) bool {
				ev, ok = rawEvent{id: e.ID, data: string(e.Data)}, true
				return false
			})
			if err != nil {
				return rawEvent{}, false
			}
			r.seen = append(r.seen, r.buf[:n]...)
			r.buf = r.buf[n:]
			if ok {
				ev.raw = strings.TrimLeft(string(r.seen), "\n")
				r.seen = r.seen[:0]
				return ev, true
			}
		}
		chunk := make([]byte, 4096)
		n, err := r.body.Read(chunk)
		r.buf = append(r.buf, chunk[:n]...)
		if n == 0 && err != nil {
			return rawEvent{}, false
		}
	}
}

// untilResult reads events up to and including the first JSON-RPC response.
func (r *eventReader) untilResult() []rawEvent {
	var out []rawEvent
	for {
		ev, ok := r.next()
		if !ok {
			return out
		}
		out = append(out, ev)
		if strings.Contains(ev.data, `"result"`) || strings.Contains(ev.data, `"error"`) {
			return out
		}
	}
}

// resumeStream sends the GET that resumes session sid's stream after lastID to url.
func resumeStream(t *testing.T, s *rawSession, url, lastID string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", s.sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Last-Event-ID", lastID)
	resp, err := s.hc.Do(req)
	require.NoError(t, err)
	return resp
}

// resultOf is the result of a JSON-RPC response.
func resultOf(t *testing.T, msg string) string {
	t.Helper()
	var m struct {
		Result json.RawMessage `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(msg), &m))
	return string(m.Result)
}

var echoWithProgress = map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"},
	"_meta": map[string]any{"progressToken": "p-1"}}

// TestReplayedResultIsTheLiveOne: a result whose top-level fields mcp-go's typed result cannot
// hold (richResult's x-future) and that reached the sandbox on an SSE stream is replayed after a
// Last-Event-ID byte for byte as the live stream sent it, on the same replica and on another
// one through a real redis-server.
func TestReplayedResultIsTheLiveOne(t *testing.T) {
	for _, tt := range []struct {
		name   string
		shared bool
	}{
		{"on the same replica", false},
		{"on another replica, through redis", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := startRawUpstream(t, "testdata/rich-catalog.json")
			cfg := config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever}
			with := func(*Options) {}
			if tt.shared {
				store := mcpsessions.NewRedis(redistest.Start(t).Client(t), "sg:", time.Second)
				with = func(o *Options) { o.Sessions = store }
			}
			a := startGatewayWith(t, "testdata/policy", with, cfg)
			a.waitReady(t)
			resumeOn := a
			if tt.shared {
				resumeOn = startGatewayWith(t, "testdata/policy", with, cfg)
				resumeOn.waitReady(t)
			}

			s := openRawSession(t, a.URL(), "127.0.0.2")
			s.id++
			resp := s.post(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call", "params": echoWithProgress})
			live := newEventReader(resp).untilResult()
			resp.Body.Close()
			require.Len(t, live, 2, "progress, then the result")
			require.NotEmpty(t, live[0].id)
			assert.JSONEq(t, richResult, resultOf(t, live[1].data), "live, the result is the upstream's")

			var replayed []rawEvent
			require.Eventually(t, func() bool { // the shared log is written off the request's path
				resp := resumeStream(t, s, resumeOn.URL(), live[0].id)
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return false
				}
				replayed = newEventReader(resp).untilResult()
				return len(replayed) > 0
			}, 5*time.Second, 20*time.Millisecond, "the stream is resumed")
			require.Len(t, replayed, 1, "only what followed Last-Event-ID")
			assert.JSONEq(t, live[1].data, replayed[0].data, "as JSON")
			assert.Equal(t, live[1].raw, replayed[0].raw, "byte for byte, event ID included")
		})
	}
}

// gatedUpstream is rawUpstream whose tool "slow" sends a progress notification for the call,
// then its result (richResult) once release is closed.
type gatedUpstream struct {
	*rawUpstream
	srv     *httptest.Server
	release chan struct{}
}

func startGatedUpstream(t *testing.T) *gatedUpstream {
	t.Helper()
	g := &gatedUpstream{rawUpstream: startRawUpstream(t, "testdata/rich-catalog.json"), release: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &m) != nil || m.Method != "tools/call" || m.Params.Name != "slow" {
			r.Body = io.NopCloser(bytes.NewReader(body))
			g.serve(w, r)
			return
		}
		var p json.RawMessage
		_ = json.Unmarshal(body, &struct {
			Params *json.RawMessage `json:"params"`
		}{&p})
		n, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/progress",
			"params": map[string]any{"progressToken": progressTokenOf(p), "progress": 1, "total": 2}})
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprintf(w, "data: %s\n\n", n)
		w.(http.Flusher).Flush()
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
		_, _ = fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%s}\n\n", m.ID, richResult)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gatedUpstream) URL() string { return g.srv.URL + "/mcp" }

// TestResultOnAResumedStreamIsTheRecordedOne: a sandbox that resumes a call's stream while the
// call runs gets the result on the resumed stream with its extra top-level fields, the bytes a
// later replay of that stream sends.
func TestResultOnAResumedStreamIsTheRecordedOne(t *testing.T) {
	up := startGatedUpstream(t)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.id++
	post := s.post(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call",
		"params": map[string]any{"name": "slow", "arguments": map[string]any{}, "_meta": map[string]any{"progressToken": 7}}})
	defer post.Body.Close()
	progress, ok := newEventReader(post).next()
	require.True(t, ok)
	require.Contains(t, progress.data, "notifications/progress")

	// The resumed stream takes the call's stream over; the result, released only now, is
	// delivered to it (or, should the upstream win the race, replayed on it: the same bytes).
	resumed := resumeStream(t, s, h.URL(), progress.id)
	defer resumed.Body.Close()
	require.Equal(t, http.StatusOK, resumed.StatusCode)
	close(up.release)
	got := newEventReader(resumed).untilResult()
	require.Len(t, got, 1)
	assert.JSONEq(t, richResult, resultOf(t, got[0].data), "the result keeps its extra fields")

	again := resumeStream(t, s, h.URL(), progress.id)
	defer again.Body.Close()
	replayed := newEventReader(again).untilResult()
	require.Len(t, replayed, 1)
	assert.Equal(t, got[0].raw, replayed[0].raw, "the replay sends the same bytes")
}
