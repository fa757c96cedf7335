package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
)

// inputUpstream is a 2026-07-28 rawUpstream whose tool ask-model (and prompt echo_prompt),
// called with an argument "ask", asks for input with a multi round-trip result (SEP-2322):
//   - "elicitation", "roots": one elicitation/create (or roots/list) request, then, when the
//     call comes back with its answer and the request state, a result quoting the answer;
//   - "unsupported": an input request of a method no revision defines for it;
//   - "forever": an elicitation/create on every round trip, never a result;
//   - "plain": no input, a result at once.
type inputUpstream struct {
	*rawUpstream
	srv   *httptest.Server
	mu    sync.Mutex
	calls []json.RawMessage // the params of every ask-model call with "ask"
}

var inputRequests = map[string]string{
	"elicitation": `{"method":"elicitation/create","params":{"message":"Which branch?",` +
		`"requestedSchema":{"type":"object","properties":{"branch":{"type":"string"}}}}}`,
	"roots":       `{"method":"roots/list"}`,
	"unsupported": `{"method":"tasks/get","params":{"taskId":"t-1"}}`,
	"forever":     `{"method":"elicitation/create","params":{"message":"Again?","requestedSchema":{"type":"object"}}}`,
}

func startInputUpstream(t *testing.T) *inputUpstream {
	t.Helper()
	u := &inputUpstream{rawUpstream: startRawUpstream(t, "testdata/rich-catalog.json")}
	u.modern = true
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		var p struct {
			Arguments struct {
				Ask string `json:"ask"`
			} `json:"arguments"`
			InputResponses map[string]json.RawMessage `json:"inputResponses"`
			RequestState   string                     `json:"requestState"`
		}
		if json.Unmarshal(body, &m) != nil || (m.Method != "tools/call" && m.Method != "prompts/get") || json.Unmarshal(m.Params, &p) != nil || p.Arguments.Ask == "" {
			r.Body = io.NopCloser(bytes.NewReader(body))
			u.serve(w, r)
			return
		}
		u.mu.Lock()
		u.calls = append(u.calls, m.Params)
		n := len(u.calls)
		u.mu.Unlock()
		result := fmt.Sprintf(`{"resultType":"input_required","requestState":"state-%d","inputRequests":{"q":%s}}`,
			n, inputRequests[p.Arguments.Ask])
		if p.Arguments.Ask == "plain" {
			result = `{"resultType":"complete","content":[{"type":"text","text":"plain"}]}`
		} else if answer, ok := p.InputResponses["q"]; ok && p.Arguments.Ask != "forever" && p.RequestState != "" {
			b, _ := json.Marshal("answer: " + string(answer))
			result = `{"resultType":"complete","content":[{"type":"text","text":` + string(b) + `}],"x-future":1}`
		}
		writeJSON(w, map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": json.RawMessage(result)})
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *inputUpstream) URL() string { return u.srv.URL + "/mcp" }

func (u *inputUpstream) asked() []json.RawMessage {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]json.RawMessage(nil), u.calls...)
}

// inputSandbox answers elicitation/create and roots/list with fixed answers (or err), and
// counts the requests.
type inputSandbox struct {
	elicited *mcp.ElicitationResult
	roots    *mcp.ListRootsResult
	err      error
	calls    atomic.Int32
}

func (s *inputSandbox) Elicit(context.Context, mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	s.calls.Add(1)
	return s.elicited, s.err
}

func (s *inputSandbox) ListRoots(context.Context, mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	s.calls.Add(1)
	return s.roots, s.err
}

// connectInputSandbox connects a legacy sandbox that answers elicitation and roots on its GET
// stream.
func connectInputSandbox(t *testing.T, url, src string, s *inputSandbox) *client.Client {
	t.Helper()
	//lint:ignore SA1019 a legacy sandbox receives server-initiated requests on the GET stream
	tr, err := transport.NewStreamableHTTP(url, transport.WithHTTPBasicClient(sandboxHTTPClient(src, nil)), transport.WithContinuousListening())
	require.NoError(t, err)
	c := client.NewClient(tr, client.WithProtocolVersion(mcp.LATEST_LEGACY_PROTOCOL_VERSION),
		client.WithElicitationHandler(s), client.WithRootsHandler(s))
	require.NoError(t, c.Start(t.Context()))
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "sandbox-" + src, Version: "1"}
	init.Params.Capabilities.Elicitation = &mcp.ElicitationCapability{}
	init.Params.Capabilities.Roots = &struct {
		ListChanged bool `json:"listChanged,omitempty"`
	}{}
	_, err = c.Initialize(t.Context(), init)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// eventsOf is every audit event of kind of a gateway, once at least n of them are written (a
// call's event is written when its handler returns, which may be after the sandbox read the
// answer); then the writer is closed, so that the count is final.
func eventsOf(t *testing.T, h *harness, kind audit.Kind, n int) []audit.Event {
	t.Helper()
	filter := func(evs []audit.Event) []audit.Event {
		var out []audit.Event
		for _, ev := range evs {
			if ev.Kind == kind {
				out = append(out, ev)
			}
		}
		return out
	}
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(h.auditDir, "audit.log"))
		var evs []audit.Event
		for _, l := range bytes.Split(b, []byte("\n")) {
			if ev, err := audit.ParseLine(l); err == nil {
				evs = append(evs, ev)
			}
		}
		return err == nil && len(filter(evs)) >= n
	}, 10*time.Second, 10*time.Millisecond, "%d %s events written", n, kind)
	return filter(h.auditEvents(t))
}

// TestUpstreamInputIsAskedOfTheSandbox: a 2026-07-28 upstream's input requests of a call
// (elicitation, roots) are asked of the calling sandbox through its client's handler; the
// upstream gets the sandbox's answer as the sandbox wrote it, with its request state, and the
// sandbox the final result. A sandbox that declines is an answer like any other.
func TestUpstreamInputIsAskedOfTheSandbox(t *testing.T) {
	for _, tt := range []struct {
		name    string
		ask     string
		sandbox *inputSandbox
		answer  string // as the upstream must receive it
	}{
		{"elicitation accepted", "elicitation", &inputSandbox{elicited: &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{
			Action: mcp.ElicitationResponseActionAccept, Content: map[string]any{"branch": "main", "n": 3}}}},
			`{"action":"accept","content":{"branch":"main","n":3}}`},
		{"elicitation declined", "elicitation", &inputSandbox{elicited: &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{
			Action: mcp.ElicitationResponseActionDecline}}}, `{"action":"decline"}`},
		{"roots", "roots", &inputSandbox{roots: &mcp.ListRootsResult{Roots: []mcp.Root{{URI: "file:///work", Name: "work"}}}},
			`{"roots":[{"uri":"file:///work","name":"work"}]}`},
		{"no roots", "roots", &inputSandbox{roots: &mcp.ListRootsResult{}}, `{"roots":[]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := startInputUpstream(t)
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
			h.waitReady(t)
			c := connectInputSandbox(t, h.URL(), "127.0.0.2", tt.sandbox)

			res, err := callTool(t, c, "ask-model", map[string]any{"ask": tt.ask})
			require.NoError(t, err)
			require.False(t, res.IsError, resultText(res))
			assert.EqualValues(t, 1, tt.sandbox.calls.Load(), "the sandbox is asked once")
			calls := up.asked()
			require.Len(t, calls, 2, "the call, then the call with the answer")
			var again struct {
				Arguments      map[string]any             `json:"arguments"`
				InputResponses map[string]json.RawMessage `json:"inputResponses"`
				RequestState   string                     `json:"requestState"`
			}
			require.NoError(t, json.Unmarshal(calls[1], &again))
			assert.Equal(t, map[string]any{"ask": tt.ask}, again.Arguments, "the arguments are sent again")
			assert.Equal(t, "state-1", again.RequestState)
			require.Contains(t, again.InputResponses, "q")
			assert.JSONEq(t, tt.answer, string(again.InputResponses["q"]), "the sandbox's answer, verbatim")
			assert.Equal(t, "answer: "+string(again.InputResponses["q"]), resultText(res), "the final result reaches the sandbox")

			evs := eventsOf(t, h, audit.KindToolsCall, 1)
			require.Len(t, evs, 1, "one event for the call, whatever its round trips")
			assert.Empty(t, evs[0].Outcome.Error)
		})
	}
}

// TestUpstreamInputThatCannotBeAnswered: an exchange that cannot complete fails the call with
// a clear error for the sandbox (a tool error result, as every upstream failure of a call) and
// one audit event whose outcome names why: an input request of a method Sandgate cannot ask a
// sandbox for, a sandbox whose client answers with an error, an upstream that keeps asking
// past the round-trip bound.
func TestUpstreamInputThatCannotBeAnswered(t *testing.T) {
	elicited := &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionCancel}}
	for _, tt := range []struct {
		name      string
		ask       string
		sandbox   *inputSandbox
		wantCalls int   // upstream calls
		wantAsked int32 // sandbox answers
		code      string
		message   string
	}{
		{"unsupported input request method", "unsupported", &inputSandbox{}, 1, 0, call.CodeUpstreamInputUnsupported,
			"asks for a method Sandgate cannot ask a sandbox for"},
		{"the sandbox's client errs", "elicitation", &inputSandbox{err: errors.New("user closed the dialog")}, 1, 1,
			call.CodeUpstreamInputUnanswered, "asked for input the sandbox's client did not give"},
		{"the upstream keeps asking", "forever", &inputSandbox{elicited: elicited}, maxInputRoundTrips, maxInputRoundTrips - 1,
			call.CodeUpstreamInputExhausted, fmt.Sprintf("still asks for input after %d round trips", maxInputRoundTrips)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := startInputUpstream(t)
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
			h.waitReady(t)
			c := connectInputSandbox(t, h.URL(), "127.0.0.2", tt.sandbox)

			res, err := callTool(t, c, "ask-model", map[string]any{"ask": tt.ask})
			require.NoError(t, err)
			assert.True(t, res.IsError)
			assert.Contains(t, resultText(res), tt.message)
			assert.Len(t, up.asked(), tt.wantCalls)
			assert.Equal(t, tt.wantAsked, tt.sandbox.calls.Load())

			// The upstream connection stays: the next call goes through.
			ok, err := callTool(t, c, "ask-model", map[string]any{"ask": "plain"})
			require.NoError(t, err)
			assert.False(t, ok.IsError, resultText(ok))

			evs := eventsOf(t, h, audit.KindToolsCall, 2)
			require.Len(t, evs, 2)
			assert.Equal(t, tt.code, evs[0].Outcome.Error, "the failed call's event names why")
			assert.Equal(t, http.StatusBadGateway, evs[0].Outcome.Status)
			assert.Empty(t, evs[1].Outcome.Error)
		})
	}
}

// TestUnsupportedInputOnPromptsGet: the same failure of a prompts/get reaches the sandbox as a
// JSON-RPC error in Sandgate's own words (never the method name the upstream chose), with one
// audit event saying why.
func TestUnsupportedInputOnPromptsGet(t *testing.T) {
	up := startInputUpstream(t)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	c := connectInputSandbox(t, h.URL(), "127.0.0.2", &inputSandbox{})
	req := mcp.GetPromptRequest{}
	req.Params.Name = "echo_prompt"
	req.Params.Arguments = map[string]string{"ask": "unsupported"}
	_, err := c.GetPrompt(t.Context(), req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "asks for a method Sandgate cannot ask a sandbox for")
	assert.NotContains(t, err.Error(), "tasks/get", "no upstream bytes in Sandgate's words")
	require.Len(t, up.asked(), 1)

	evs := eventsOf(t, h, audit.KindPromptsGet, 1)
	require.Len(t, evs, 1)
	assert.Equal(t, call.CodeUpstreamInputUnsupported, evs[0].Outcome.Error)
}
