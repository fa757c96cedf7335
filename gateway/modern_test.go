package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
)

// A sandbox of 2026-07-28 through Sandgate, as a direct client of that revision sees a server
// of it: the answers carry resultType, lists say they are the caller's own (cacheScope
// private) with the upstream's ttlMs, and a 2026-07-28 upstream's input_required is relayed
// with a state of Sandgate's, which resumes the upstream's own.

// inputResultOf reads an input_required result.
func inputResultOf(t *testing.T, res json.RawMessage) (resultType string, requests map[string]json.RawMessage, state string) {
	t.Helper()
	var r struct {
		ResultType    string                     `json:"resultType"`
		InputRequests map[string]json.RawMessage `json:"inputRequests"`
		RequestState  string                     `json:"requestState"`
	}
	require.NoError(t, json.Unmarshal(res, &r), "%s", res)
	return r.ResultType, r.InputRequests, r.RequestState
}

func TestModernSandboxGetsTheUpstreamsInputRequiredWithSandgatesState(t *testing.T) {
	up := startInputUpstream(t)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openModernSession(t, h.URL(), "127.0.0.2", map[string]any{"elicitation": map[string]any{}})
	params := map[string]any{"name": "ask-model", "arguments": map[string]any{"ask": "elicitation"}}

	first := s.call("tools/call", params)
	rt, reqs, state := inputResultOf(t, first)
	assert.Equal(t, "input_required", rt)
	require.Contains(t, reqs, "q", "the upstream's input request, as it wrote it")
	assert.Contains(t, string(reqs["q"]), `"method":"elicitation/create"`)
	require.NotEmpty(t, state)
	assert.NotContains(t, state, "state-1", "the upstream's own state is sealed in Sandgate's")

	retry := map[string]any{"name": "ask-model", "arguments": map[string]any{"ask": "elicitation"},
		"inputResponses": map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"name": "Ada"}}},
		"requestState":   state}
	final := s.call("tools/call", retry)
	assert.Contains(t, string(final), `"resultType":"complete"`)
	assert.Contains(t, resultTextOf(t, final), "Ada", "the final result quotes the answer")
	calls := up.asked()
	require.Len(t, calls, 2)
	var again struct {
		RequestState   string                     `json:"requestState"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
	}
	require.NoError(t, json.Unmarshal(calls[1], &again))
	assert.Equal(t, "state-1", again.RequestState, "the upstream gets its own state back")
	assert.Contains(t, string(again.InputResponses["q"]), "Ada")
}

// A sealed state is the request's and its sandbox's: another sandbox's retry with it, the same
// sandbox's retry for another tool, and a state Sandgate never made are refused (invalid
// params, audited) and reach no upstream.
func TestModernRequestStateBelongsToItsSandboxAndCall(t *testing.T) {
	up := startInputUpstream(t)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	owner := openModernSession(t, h.URL(), "127.0.0.2", map[string]any{"elicitation": map[string]any{}})
	_, _, state := inputResultOf(t, owner.call("tools/call", map[string]any{"name": "ask-model", "arguments": map[string]any{"ask": "elicitation"}}))
	answer := map[string]any{"q": map[string]any{"action": "accept", "content": map[string]any{"name": "Mallory"}}}

	other := openModernSession(t, h.URL(), "127.0.0.1", map[string]any{"elicitation": map[string]any{}})
	for name, try := range map[string]struct {
		s      *rawSession
		params map[string]any
	}{
		"another sandbox": {other, map[string]any{"name": "ask-model", "arguments": map[string]any{"ask": "elicitation"}, "inputResponses": answer, "requestState": state}},
		"another tool":    {owner, map[string]any{"name": "echo", "arguments": map[string]any{"ask": "elicitation"}, "inputResponses": answer, "requestState": state}},
		"a forged state":  {owner, map[string]any{"name": "ask-model", "arguments": map[string]any{"ask": "elicitation"}, "inputResponses": answer, "requestState": "state-1"}},
	} {
		_, rpcErr, _ := try.s.exchange("tools/call", try.params)
		require.NotNil(t, rpcErr, name)
		assert.Contains(t, string(rpcErr), `"code":-32602`, name)
	}
	assert.Len(t, up.asked(), 1, "no refused retry reached the upstream")
	refused := 0
	for _, ev := range eventsOf(t, h, audit.KindToolsCall, 4) {
		if ev.Outcome.Error == call.CodeBadParams {
			refused++
		}
	}
	assert.Equal(t, 3, refused, "each refused retry is audited")
}

// A request whose standard headers say other than its body is refused before anything of it is
// decided or sent: -32020, HTTP 400, audited as header_mismatch.
func TestHeaderMismatchIsRefusedAndAudited(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openModernSession(t, h.URL(), "127.0.0.2", nil)
	for name, hdr := range map[string]http.Header{
		"another tool named":    {"Mcp-Name": {"delete_everything"}},
		"another method named":  {"Mcp-Method": {"tools/list"}},
		"another revision said": {"Mcp-Protocol-Version": {"2025-11-25"}},
	} {
		s.id++
		resp := s.postWith(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call",
			"params": map[string]any{"name": "echo", "arguments": map[string]any{"message": "x"}}}, hdr)
		var body struct {
			Error struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body), name)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, name)
		assert.Equal(t, -32020, body.Error.Code, name)
	}
	assert.Empty(t, up.received("tools/call"), "nothing reached the upstream")
	evs := eventsOf(t, h, audit.KindToolsCall, 3)
	for _, ev := range evs {
		assert.Equal(t, call.CodeHeaderMismatch, ev.Outcome.Error)
		assert.False(t, ev.Decision.Allow)
		assert.Equal(t, 400, ev.Outcome.Status)
	}
}

// Lists filtered per identity are private to the caller (cacheScope) and keep the upstream's
// ttlMs; results carry resultType; a 2026-07-28 upstream gets Mcp-Method and Mcp-Name.
func TestModernAnswersCarryTheirRevisionsFields(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	up.mu.Lock()
	up.modern = true
	up.mu.Unlock()
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openModernSession(t, h.URL(), "127.0.0.2", nil)
	var list struct {
		ResultType string `json:"resultType"`
		CacheScope string `json:"cacheScope"`
		TTL        *int64 `json:"ttlMs"`
	}
	require.NoError(t, json.Unmarshal(s.call("tools/list", nil), &list))
	assert.Equal(t, "complete", list.ResultType)
	assert.Equal(t, "private", list.CacheScope, "what a sandbox is shown is its own, whatever the upstream said")
	require.NotNil(t, list.TTL)
	assert.EqualValues(t, 60000, *list.TTL, "the upstream's ttlMs")

	res := s.call("tools/call", map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"}})
	assert.Contains(t, string(res), `"resultType":"complete"`)
	assert.NotContains(t, string(res), "io.modelcontextprotocol/serverInfo", "the upstream hop's own _meta stays there")
	read := s.call("resources/read", map[string]any{"uri": "note://rich/readme"})
	assert.Contains(t, string(read), `"cacheScope":"private"`)
	calls := up.received("tools/call")
	require.NotEmpty(t, calls)
	last := calls[len(calls)-1]
	assert.Equal(t, "tools/call", last.Header.Get("Mcp-Method"))
	assert.Equal(t, "echo", last.Header.Get("Mcp-Name"))
	assert.Equal(t, "2026-07-28", last.Header.Get("Mcp-Protocol-Version"))
}

// resultTextOf is the text of a tool result's content.
func resultTextOf(t *testing.T, res json.RawMessage) string {
	t.Helper()
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	require.NoError(t, json.Unmarshal(res, &r), "%s", res)
	out := ""
	for _, c := range r.Content {
		out += c.Text
	}
	return out
}

// A sandbox of 2026-07-28 hears of a resource's updates on its subscriptions/listen stream,
// served by Sandgate from a legacy upstream's resources/subscribe: the acknowledgement first,
// then each update with the stream's subscriptionId; a sandbox listening to nothing gets none.
func TestListenStreamGetsResourceUpdates(t *testing.T) {
	refs := references(t)
	for _, mode := range []string{config.SessionsPerSandbox, config.SessionsShared} {
		t.Run(mode, func(t *testing.T) {
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: refs.startTS(t),
				Prefix: config.PrefixNever, Sessions: mode})
			h.waitReady(t)
			s := openModernSession(t, h.URL(), "127.0.0.2", nil)
			var list struct {
				Resources []struct {
					URI string `json:"uri"`
				} `json:"resources"`
			}
			require.NoError(t, json.Unmarshal(s.call("resources/list", nil), &list))
			require.NotEmpty(t, list.Resources)
			uri := list.Resources[0].URI

			s.id++
			resp := s.post(map[string]any{"jsonrpc": "2.0", "id": "listen:0", "method": "subscriptions/listen",
				"params": map[string]any{"notifications": map[string]any{"resourceSubscriptions": []string{uri}, "toolsListChanged": true}}})
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			// A deadline, not a wait: the server's updates come every 5 s; without one in 30 s
			// the stream is closed and the test fails on its line.
			defer time.AfterFunc(30*time.Second, func() { resp.Body.Close() }).Stop()
			events := newEventReader(resp)
			ack, ok := events.next()
			require.True(t, ok)
			assert.Contains(t, ack.data, `"method":"notifications/subscriptions/acknowledged"`)
			assert.Contains(t, ack.data, `"io.modelcontextprotocol/subscriptionId":"listen:0"`)
			assert.Contains(t, ack.data, uri)

			// The server sends a session's updates once it turns them on, outside any call.
			res := s.call("tools/call", map[string]any{"name": "toggle-subscriber-updates", "arguments": map[string]any{}})
			require.NotContains(t, string(res), `"isError":true`, "%s", res)
			for {
				ev, ok := events.next()
				require.True(t, ok, "the stream ended (or 30 s passed) without the update")
				if !strings.Contains(ev.data, "notifications/resources/updated") {
					continue
				}
				assert.Contains(t, ev.data, `"uri":"`+uri+`"`)
				assert.Contains(t, ev.data, `"io.modelcontextprotocol/subscriptionId":"listen:0"`)
				break
			}
		})
	}
}

// On a stateful upstream each sandbox of 2026-07-28 (which has no session) gets an upstream
// session of its own, as a legacy sandbox session does: reused for its later requests, never
// another sandbox's or the catalog's.
func TestModernSandboxesGetAnUpstreamSessionEach(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever,
		Sessions: config.SessionsPerSandbox, MaxSessions: 8})
	h.waitReady(t)
	a, b := openModernSession(t, h.URL(), "127.0.0.2", nil), openModernSession(t, h.URL(), "127.0.0.3", nil)
	first := callSessions(t, up, a, b)
	again := callSessions(t, up, a, b)
	catalog := up.received("tools/list")[0].Session
	assert.NotEqual(t, first[0], first[1], "two sandboxes never share an upstream session")
	assert.NotContains(t, first, catalog, "sandboxes do not use the catalog's session")
	assert.Equal(t, first, again, "a sandbox keeps its upstream session")
}

// A legacy upstream asks for input with a request on the call's stream, which a sandbox of
// 2026-07-28 cannot receive: Sandgate parks the upstream call and answers input_required with
// the upstream's request; the sandbox's retry answers it, and the same upstream call resumes and
// ends in the result, the answer in it. One event per request, and one for the upstream's.
func TestModernSandboxAnswersALegacyUpstreamsRequestForInput(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: references(t).startTS(t), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openModernSession(t, h.URL(), "127.0.0.2", map[string]any{"elicitation": map[string]any{"form": map[string]any{}}})
	rt, reqs, state := inputResultOf(t, s.call("tools/call", map[string]any{"name": "trigger-elicitation-request", "arguments": map[string]any{}}))
	require.Equal(t, "input_required", rt)
	require.Len(t, reqs, 1)
	var key string
	for k, r := range reqs {
		key = k
		assert.Contains(t, string(r), `"method":"elicitation/create"`)
		assert.Contains(t, string(r), `"requestedSchema"`, "the upstream's request, as it wrote it")
	}
	final := s.call("tools/call", map[string]any{"name": "trigger-elicitation-request", "arguments": map[string]any{},
		"inputResponses": map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"name": "Ada"}}},
		"requestState":   state})
	assert.Contains(t, string(final), `"resultType":"complete"`)
	assert.Contains(t, resultTextOf(t, final), "Ada", "the upstream got the sandbox's answer")
	evs := eventsOf(t, h, audit.KindToolsCall, 2)
	require.Len(t, evs, 2, "one event per request")
	for _, ev := range evs {
		assert.Empty(t, ev.Outcome.Error)
	}
}

// A client that goes away is a cancellation, never a policy or upstream error: a 2026-07-28
// request whose stream the sandbox closes mid-call, and a legacy call the sandbox cancels with
// notifications/cancelled, are audited as cancelled (499), and the upstream's work is cancelled.
func TestACancelledCallIsAuditedAsCancelled(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever})
	h.waitReady(t)

	modern := openModernSession(t, h.URL(), "127.0.0.2", nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		body, _ := json.Marshal(modern.enveloped(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
			"params": map[string]any{"name": "slow", "arguments": map[string]any{}}}))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.URL(), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "slow")
		if resp, err := modern.hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return len(up.received("tools/call")) == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	<-done

	legacy := openRawSession(t, h.URL(), "127.0.0.1")
	legacy.id++
	go func() {
		resp := legacy.post(map[string]any{"jsonrpc": "2.0", "id": 77, "method": "tools/call",
			"params": map[string]any{"name": "slow", "arguments": map[string]any{}}})
		resp.Body.Close()
	}()
	require.Eventually(t, func() bool { return len(up.received("tools/call")) == 2 }, 10*time.Second, 5*time.Millisecond)
	legacy.post(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": map[string]any{"requestId": 77}}).Body.Close()

	evs := eventsOf(t, h, audit.KindToolsCall, 2)
	require.Len(t, evs, 2)
	for _, ev := range evs {
		assert.Equal(t, call.CodeCancelled, ev.Outcome.Error)
		assert.Equal(t, 499, ev.Outcome.Status)
		assert.True(t, ev.Decision.Allow, "policy allowed it: the client cancelled")
	}
}

// No notification of a call is lost or reordered at its start or its end: 1,000 calls, from
// sandboxes of both revisions side by side, each told a log message first and its progress
// last by the upstream, each read by its sandbox in that order before its result.
func TestNotificationsOfAThousandCallsKeepTheirPlace(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever,
		Sessions: config.SessionsShared, MaxNotificationRate: 1e6})
	h.waitReady(t)
	const sandboxes, calls = 8, 125
	var wg sync.WaitGroup
	errs := make(chan string, sandboxes*calls)
	for i := range sandboxes {
		var s *rawSession
		if i%2 == 0 {
			s = openRawSession(t, h.URL(), "127.0.0.2")
			s.call("logging/setLevel", map[string]any{"level": "info"})
		} else {
			s = openModernSession(t, h.URL(), "127.0.0.2", nil)
		}
		wg.Go(func() {
			for n := range calls {
				meta := map[string]any{"progressToken": fmt.Sprint("p", i, "-", n)}
				if s.modern {
					meta["io.modelcontextprotocol/logLevel"] = "info"
				}
				res, rpcErr, notes := s.exchange("tools/call", map[string]any{"name": "bare", "arguments": map[string]any{}, "_meta": meta})
				var got []string
				for _, m := range notes {
					got = append(got, m.Method)
				}
				if rpcErr != nil || res == nil || fmt.Sprint(got) != "[notifications/message notifications/progress]" {
					errs <- fmt.Sprintf("sandbox %d call %d: %v %s %s", i, n, got, rpcErr, res)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	var failed []string
	for e := range errs {
		failed = append(failed, e)
	}
	assert.Empty(t, failed, "every call's notifications, in order, before its result")
}
