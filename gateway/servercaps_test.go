package gateway

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// Sandgate's server capabilities name what a server offers: elicitation and roots are client
// capabilities (a server asks for them), and Sandgate passes an upstream's requests for them on
// itself (route.go), so it declares neither.
func TestServerCapabilitiesNameNoClientCapability(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL()})
	h.waitReady(t)
	s := &rawSession{t: t, url: h.URL(), hc: sandboxHTTPClient("127.0.0.2", nil)}
	res := s.call("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}})
	var init struct {
		Capabilities map[string]json.RawMessage `json:"capabilities"`
	}
	require.NoError(t, json.Unmarshal(res, &init), "%s", res)
	assert.Contains(t, init.Capabilities, "tools")
	assert.NotContains(t, init.Capabilities, "elicitation")
	assert.NotContains(t, init.Capabilities, "roots")
	assert.NotContains(t, init.Capabilities, "sampling")
}
