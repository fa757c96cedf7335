package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scriptedUpstream answers every POST with handler and records the requests it received.
type scriptedUpstream struct {
	mu   sync.Mutex
	got  []*http.Request
	body [][]byte
}

func (s *scriptedUpstream) requests() ([]*http.Request, [][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.got...), append([][]byte(nil), s.body...)
}

// newModernTransport is an upstreamHTTP on a 2026-07-28 connection to a loopback server
// that answers with handler.
func newModernTransport(t *testing.T, handler http.HandlerFunc) (*upstreamHTTP, *scriptedUpstream) {
	t.Helper()
	rec := &scriptedUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.got, rec.body = append(rec.got, r.Clone(context.Background())), append(rec.body, b)
		rec.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		handler(w, r)
	}))
	t.Cleanup(srv.Close)
	base, err := transport.NewStreamableHTTP(srv.URL + "/mcp")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	tr := &upstreamHTTP{StreamableHTTP: base, url: srv.URL + "/mcp", http: srv.Client(), log: slog.New(slog.DiscardHandler),
		headers: func(context.Context) map[string]string { return map[string]string{"X-Upstream-Key": "k-1"} },
		closed:  ctx, close: cancel}
	tr.SetProtocolVersion(mcp.ProtocolVersion20260728)
	t.Cleanup(func() { _ = tr.Close() })
	return tr, rec
}

func toolCall(id string) transport.JSONRPCRequest {
	h := http.Header{}
	h.Set(mcp.HeaderMethod, "tools/call")
	return transport.JSONRPCRequest{JSONRPC: "2.0", ID: mcp.NewRequestId(id), Method: "tools/call",
		Params: json.RawMessage(`{"name":"echo","arguments":{"n":9007199254740993,"html":"<b>&"}}`), Header: h}
}

func sseBody(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, body)
}

func TestUpstreamHTTPSendsTheRequestAsBuilt(t *testing.T) {
	tr, rec := newModernTransport(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":"sg-1","result":{"content":[],"x-future":1}}`)
	})
	res, err := tr.SendRequest(t.Context(), toolCall("sg-1"))
	require.NoError(t, err)
	assert.JSONEq(t, `{"content":[],"x-future":1}`, string(res.Result), "the result as the upstream wrote it")
	assert.Equal(t, "sg-1", res.ID.Value())

	reqs, bodies := rec.requests()
	require.Len(t, reqs, 1)
	h := reqs[0].Header
	assert.Equal(t, "application/json", h.Get("Content-Type"))
	assert.Equal(t, "application/json, text/event-stream", h.Get("Accept"))
	assert.Equal(t, mcp.ProtocolVersion20260728, h.Get("Mcp-Protocol-Version"))
	assert.Equal(t, "k-1", h.Get("X-Upstream-Key"), "the credential")
	assert.Equal(t, "tools/call", h.Get(mcp.HeaderMethod), "the revision's standard header")
	assert.Empty(t, h.Get("Mcp-Session-Id"), "2026-07-28 has no session")
	assert.Equal(t, `{"jsonrpc":"2.0","id":"sg-1","method":"tools/call","params":`+
		`{"name":"echo","arguments":{"n":9007199254740993,"html":"<b>&"}}}`, string(bodies[0]),
		"params go as Sandgate encoded them: big integers and HTML characters as written")
}

func TestUpstreamHTTPReadsEveryStreamShape(t *testing.T) {
	long := strings.Repeat("x", 10000) // past bufio's 4096-byte buffer
	progress := func(n int) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":%d}}`, n)
	}
	result := `{"jsonrpc":"2.0","id":"sg-1","result":{"content":[{"type":"text","text":"` + long + `"}]}}`
	cases := map[string]string{
		"LF":                     "data: " + progress(1) + "\n\ndata: " + progress(2) + "\n\ndata: " + result + "\n\n",
		"CRLF":                   "data: " + progress(1) + "\r\n\r\ndata: " + progress(2) + "\r\n\r\ndata: " + result + "\r\n\r\n",
		"ids, types and retry":   "id: 1\nevent: message\nretry: 5\ndata: " + progress(1) + "\n\n: a comment\nid: 2\ndata: " + progress(2) + "\n\nid: 3\ndata: " + result + "\n\n",
		"data over lines":        "data: {\"jsonrpc\":\"2.0\",\ndata: \"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"p\",\"progress\":1}}\n\ndata: " + progress(2) + "\n\ndata: " + result + "\n\n",
		"no blank line at end":   "data: " + progress(1) + "\n\ndata: " + progress(2) + "\n\ndata: " + result,
		"an event that is noise": "data: not json\n\ndata: " + progress(1) + "\n\ndata: " + progress(2) + "\n\ndata: " + result + "\n\n",
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			tr, _ := newModernTransport(t, func(w http.ResponseWriter, r *http.Request) { sseBody(w, body) })
			var seen []float64
			tr.SetNotificationHandler(func(n mcp.JSONRPCNotification) {
				seen = append(seen, n.Params.AdditionalFields["progress"].(float64))
			})
			res, err := tr.SendRequest(t.Context(), toolCall("sg-1"))
			require.NoError(t, err)
			assert.Equal(t, []float64{1, 2}, seen, "every notification, in order, before the result")
			assert.Contains(t, string(res.Result), long)
		})
	}
}

func TestUpstreamHTTPStreamWithoutAResponse(t *testing.T) {
	tr, _ := newModernTransport(t, func(w http.ResponseWriter, r *http.Request) {
		sseBody(w, "id: ev-1\nretry: 10\ndata: \n\n")
	})
	_, err := tr.SendRequest(t.Context(), toolCall("sg-1"))
	require.EqualError(t, err, "unexpected nil response", "2026-07-28 streams are not resumed")
}

func TestUpstreamHTTPRefusals(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		check   func(t *testing.T, res *transport.JSONRPCResponse, err error)
	}{
		{"404", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) },
			func(t *testing.T, _ *transport.JSONRPCResponse, err error) {
				require.ErrorIs(t, err, transport.ErrSessionTerminated)
			}},
		{"401", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusUnauthorized) },
			func(t *testing.T, _ *transport.JSONRPCResponse, err error) {
				require.ErrorIs(t, err, transport.ErrAuthorizationRequired)
			}},
		{"500 with a JSON-RPC error", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":"sg-1","error":{"code":-32603,"message":"boom"}}`)
		}, func(t *testing.T, res *transport.JSONRPCResponse, err error) {
			require.NoError(t, err)
			require.NotNil(t, res.Error)
			assert.Equal(t, "boom", res.Error.Message)
		}},
		{"500 with text", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "broken")
		}, func(t *testing.T, _ *transport.JSONRPCResponse, err error) {
			require.EqualError(t, err, "request failed with status 500: broken")
		}},
		{"no id", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","result":{}}`)
		}, func(t *testing.T, _ *transport.JSONRPCResponse, err error) {
			require.ErrorContains(t, err, "should contain RPC id")
		}},
		{"not JSON", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"jsonrpc":`)
		}, func(t *testing.T, _ *transport.JSONRPCResponse, err error) {
			require.ErrorContains(t, err, "failed to decode response")
		}},
		{"another content type", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
		}, func(t *testing.T, _ *transport.JSONRPCResponse, err error) {
			require.EqualError(t, err, "unexpected content type: text/html")
		}},
		{"an error member", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":"sg-1","error":{"code":-32602,"message":"bad","data":{"k":1}}}`)
		}, func(t *testing.T, res *transport.JSONRPCResponse, err error) {
			require.NoError(t, err)
			require.NotNil(t, res.Error)
			assert.Equal(t, -32602, res.Error.Code)
			assert.Nil(t, res.Result)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, _ := newModernTransport(t, c.handler)
			res, err := tr.SendRequest(t.Context(), toolCall("sg-1"))
			c.check(t, res, err)
		})
	}
}

// A request the server sends on a response stream is answered with the client's handler.
func TestUpstreamHTTPAnswersAServerRequest(t *testing.T) {
	answered := make(chan []byte, 1)
	tr, _ := newModernTransport(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), `"result"`) { // the answer
			answered <- b
			w.WriteHeader(http.StatusAccepted)
			return
		}
		sseBody(w, `data: {"jsonrpc":"2.0","id":7,"method":"roots/list"}`+"\n\n"+
			`data: {"jsonrpc":"2.0","id":"sg-1","result":{"content":[]}}`+"\n\n")
	})
	tr.SetRequestHandler(func(_ context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
		return &transport.JSONRPCResponse{JSONRPC: "2.0", ID: req.ID, Result: json.RawMessage(`{"roots":[]}`)}, nil
	})
	_, err := tr.SendRequest(t.Context(), toolCall("sg-1"))
	require.NoError(t, err)
	assert.JSONEq(t, `{"jsonrpc":"2.0","id":7,"result":{"roots":[]}}`, string(<-answered))
}

// Closing the connection ends the requests in flight on it, as mcp-go's transport does.
func TestUpstreamHTTPCloseEndsRequestsInFlight(t *testing.T) {
	arrived := make(chan struct{})
	tr, _ := newModernTransport(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
	})
	errc := make(chan error, 1)
	go func() {
		_, err := tr.SendRequest(context.Background(), toolCall("sg-1"))
		errc <- err
	}()
	<-arrived
	require.NoError(t, tr.Close())
	require.ErrorIs(t, <-errc, context.Canceled)
}

// Requests that set the connection up, and every request of a legacy connection, are mcp-go's.
func TestUpstreamHTTPLeavesSetupAndLegacyToMCPGo(t *testing.T) {
	tr, rec := newModernTransport(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	_, err := tr.SendRequest(t.Context(), transport.JSONRPCRequest{JSONRPC: "2.0", ID: mcp.NewRequestId(int64(1)),
		Method: string(mcp.MethodServerDiscover), Params: map[string]any{"a": "<"}})
	require.NoError(t, err)
	tr.SetProtocolVersion(mcp.LATEST_LEGACY_PROTOCOL_VERSION)
	_, err = tr.SendRequest(t.Context(), transport.JSONRPCRequest{JSONRPC: "2.0", ID: mcp.NewRequestId(int64(1)),
		Method: "tools/call", Params: map[string]any{"a": "<"}})
	require.NoError(t, err)
	_, bodies := rec.requests()
	for _, b := range bodies {
		assert.Contains(t, string(b), `\u003c`, "mcp-go's encoding (HTML-escaped) shows it sent them")
	}
}

func TestEncodeRequestIsJSON(t *testing.T) {
	cases := []transport.JSONRPCRequest{
		{ID: mcp.NewRequestId("sg-1"), Method: "tools/call", Params: json.RawMessage(`{"name":"a"}`)},
		{ID: mcp.NewRequestId(int64(42)), Method: "ping"},
		{ID: mcp.NewRequestId("q\"\\\u2028é"), Method: "m\u0001", Params: map[string]any{"k": []int{1}}},
		{ID: mcp.NewRequestId(3.5), Method: "x", Params: mcp.ReadResourceParams{URI: "note://a"}},
	}
	for _, req := range cases {
		got, err := encodeRequest(req)
		require.NoError(t, err)
		req.JSONRPC = "2.0"
		want, err := json.Marshal(req)
		require.NoError(t, err)
		assert.JSONEq(t, string(want), string(got))
	}
}

// decodeMessage reads what encoding/json reads into mcp-go's response type.
func FuzzDecodeMessage(f *testing.F) {
	for _, s := range []string{`{"jsonrpc":"2.0","id":"sg-1","result":{"a":1}}`, `{"id":1,"error":{"code":1,"message":"m"}}`,
		`{"method":"notifications/progress","params":{"progress":1}}`, `{"ID":"x","Result":[1]}`, `{"id":null,"result":1}`,
		`{"id":"a\u0062","result":{},"result":2}`, `{"id":1,"method":"roots/list","params":[]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeMessage(data)
		if err != nil {
			return
		}
		// mcp-go's response type, without the "jsonrpc" member it does not check either.
		var want struct {
			ID     mcp.RequestId   `json:"id"`
			Method string          `json:"method"`
			Result json.RawMessage `json:"result,omitempty"`
			Error  json.RawMessage `json:"error,omitempty"`
		}
		require.NoError(t, json.Unmarshal(data, &want), "decodeMessage read what encoding/json refuses: %q", data)
		assert.Equal(t, want.ID.IsNil(), m.ID.IsNil(), "%q", data)
		assert.Equal(t, want.ID.Value(), m.ID.Value(), "%q", data)
		assert.Equal(t, want.Method, m.Method, "%q", data)
		assert.Equal(t, string(want.Result), string(m.Result), "%q", data)
		var details *mcp.JSONRPCErrorDetails
		if json.Unmarshal(want.Error, &details) == nil && details != nil {
			assert.Equal(t, *details, *m.response().Error, "%q", data)
		}
	})
}
