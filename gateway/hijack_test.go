package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
)

// A flood of junk from one source cannot hide what it does next: after 50 malformed requests
// (well past the 20 rejection events a source gets per window, which heads refused before any
// request exists share), a POST with another sandbox's Mcp-Session-Id is still its own event.
// Each malformed request is a request read and refused, one event each (kind mcp.request), as
// the proxy's requests are. The window is an hour, so the flood and the hijack fall in one
// window however slow the machine.
func TestHijackAfterAJunkFloodIsAudited(t *testing.T) {
	up := startHTTPUpstream(t, "127.0.0.1:0")
	h := startGatewayWith(t, "testdata/policy", func(o *Options) {
		core, err := call.New(call.Options{Policy: o.Policy, Audit: o.Audit, Log: o.Log,
			Rejections: call.RejectionLimit{PerWindow: 20, Window: time.Hour}})
		require.NoError(t, err)
		o.Core = core
	}, config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(t)

	victim := sandboxHTTPClient("127.0.0.2", nil)
	resp, _ := post(t, victim, h.URL(), initBody, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sid := resp.Header.Get("Mcp-Session-Id")
	require.NotEmpty(t, sid)

	attacker := sandboxHTTPClient("127.0.0.3", nil)
	for range 50 {
		resp, _ := post(t, attacker, h.URL(), `{"jsonrpc":"2.0",`, nil)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	}
	resp, _ = post(t, attacker, h.URL(), `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, map[string]string{"Mcp-Session-Id": sid})
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "answered like an unknown session")

	var hijacks, junk int
	for _, ev := range h.auditEvents(t) {
		if ev.Identity.SourceIP != "127.0.0.3" {
			continue
		}
		switch {
		case ev.Outcome.Error == call.CodeSessionNotOwned && ev.Kind == audit.KindToolsList:
			hijacks++
		case ev.Outcome.Error == call.CodeMalformedRequest && ev.Kind == audit.KindMCPRequest:
			junk++
		}
	}
	assert.Equal(t, 1, hijacks, "the hijack attempt has its event")
	assert.Equal(t, 50, junk, "each malformed request has its event")
}
