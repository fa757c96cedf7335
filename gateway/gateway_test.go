package gateway

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/respguard"
)

func TestTwoSandboxesSeeAndCallAccordingToPolicy(t *testing.T) {
	up := startHTTPUpstream(t, "127.0.0.1:0")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: up.URL(),
		Credential: &config.CredentialRef{Name: "upstream", Header: "Authorization", Format: "Bearer {value}"}})
	h.waitReady(t)

	rec := &recorder{}
	full := connectSandbox(t, h.URL(), "127.0.0.2", rec)
	narrow := connectSandbox(t, h.URL(), "127.0.0.3", rec)

	assert.ElementsMatch(t, []string{"echo", "add"}, toolNames(t, full), "full template sees every tool")
	assert.Equal(t, []string{"echo"}, toolNames(t, narrow), "narrow template sees echo only")

	calls := 0
	tests := []struct {
		name      string
		sandbox   string
		tool      string
		args      map[string]any
		wantErr   bool   // JSON-RPC error: the tool does not exist for this caller
		wantIsErr bool   // tool error result
		wantText  string // substring of the result text
	}{
		{"visible allowed tool is forwarded", "full", "echo", map[string]any{"message": "hi"}, false, false, "hi"},
		{"second allowed tool is forwarded", "full", "add", map[string]any{"a": 2, "b": 3}, false, false, "5"},
		{"narrow sandbox calls its one tool", "narrow", "echo", map[string]any{"message": "yo"}, false, false, "yo"},
		{"hidden tool answers like an unknown tool", "narrow", "add", map[string]any{"a": 1, "b": 1}, true, false, ""},
		{"unknown tool is not found", "full", "nope", nil, true, false, ""},
		{"visible tool denied by arguments returns the policy reason", "full", "echo", map[string]any{"message": "forbidden"}, false, true, "may not be echoed"},
		{"an upstream echoing the credential it got hands the sandbox none of it", "full", "echo", map[string]any{"message": "{authorization}"}, false, false, "Bearer " + respguard.Marker[:8]},
	}
	var hiddenErr, unknownErr string
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := full
			if tt.sandbox == "narrow" {
				c = narrow
			}
			calls++
			res, err := callTool(t, c, tt.tool, tt.args)
			if tt.wantErr {
				require.Error(t, err)
				if tt.tool == "add" {
					hiddenErr = err.Error()
				} else {
					unknownErr = err.Error()
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantIsErr, res.IsError)
			assert.Contains(t, resultText(res), tt.wantText)
		})
	}
	assert.Equal(t, unknownErr, replaceName(hiddenErr, "add", "nope"),
		"a hidden tool's error is the unknown tool's error")

	// The upstream got the injected credential on every request and never the sandbox's.
	auths := up.seenAuth()
	require.NotEmpty(t, auths)
	for _, a := range auths {
		assert.Equal(t, "Bearer "+upstreamSecret, a)
	}
	assert.NotContains(t, string(rec.bytes()), upstreamSecret, "no sandbox-visible byte holds the credential")

	evs := h.auditEvents(t)
	var callEvents, listEvents, echoed int
	for _, ev := range evs {
		switch ev.Kind {
		case audit.KindToolsCall:
			callEvents++
			if ev.Outcome.CredentialEchoed {
				echoed++
			}
		case audit.KindToolsList:
			listEvents++
			require.NotNil(t, ev.Target.Shown)
		}
		assert.NotContains(t, ev.Decision.Reason+ev.Outcome.Error+ev.Credential, upstreamSecret)
	}
	assert.Equal(t, calls, callEvents, "exactly one audit event per tools/call")
	assert.Equal(t, 2, listEvents, "one audit event per tools/list")
	assert.Equal(t, 1, echoed, "the echoing call's event says credential_echoed")
}

func replaceName(s, from, to string) string {
	return string(bytes.ReplaceAll([]byte(s), []byte("'"+from+"'"), []byte("'"+to+"'")))
}
