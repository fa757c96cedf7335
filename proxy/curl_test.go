package proxy

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// curl runs a real curl through the proxy from a sandbox address and returns status, headers
// and body.
func (h *harness) curl(t *testing.T, from string, args ...string) (status string, headers, body string) {
	t.Helper()
	base := []string{"-sS", "--max-time", "10", "--interface", from, "--proxy", "http://" + h.addr, "--cacert", h.caPath,
		"-D", "-", "-H", "x-api-key: sk-placeholder", "-H", "Authorization: Bearer sk-placeholder", "-H", "content-type: application/json"}
	cmd := exec.Command("curl", append(base, args...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	sandboxReads.Add(t.Name()+" (curl)", out)
	require.NoError(t, err, "curl: %s", stderr.String())
	head, b, _ := strings.Cut(string(out), "\r\n\r\n")
	// curl prints the CONNECT response head first.
	for strings.HasPrefix(b, "HTTP/") {
		head, b, _ = strings.Cut(b, "\r\n\r\n")
	}
	status = strings.Fields(head)[1]
	return status, head, b
}

func TestCurlThroughInterception(t *testing.T) {
	h := newHarness(t)
	const url = "https://api.anthropic.com/v1/messages"
	tests := []struct {
		name       string
		from       string
		model      string
		stream     bool
		wantStatus string
		wantTokens [2]int64
	}{
		{"sandbox alpha may use sonnet (JSON)", "127.0.0.2", "claude-sonnet-4-5", false, "200", [2]int64{12, 34}},
		{"sandbox alpha may use sonnet (SSE stream)", "127.0.0.2", "claude-sonnet-4-5", true, "200", [2]int64{25, 15}},
		{"sandbox alpha may not use haiku", "127.0.0.2", "claude-haiku-4-5", false, "403", [2]int64{}},
		{"sandbox beta may use haiku (SSE stream)", "127.0.0.3", "claude-haiku-4-5", true, "200", [2]int64{25, 15}},
		{"sandbox beta may not use sonnet", "127.0.0.3", "claude-sonnet-4-5", false, "403", [2]int64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"` + tt.model + `","max_tokens":100,"messages":[{"role":"user","content":"hi"}]` +
				map[bool]string{true: `,"stream":true}`, false: `}`}[tt.stream]
			keysBefore, _ := h.up.seen()
			status, headers, resp := h.curl(t, tt.from, "-d", body, url)
			assert.Equal(t, tt.wantStatus, status, resp)
			assert.NotContains(t, headers+resp, realKey, "the sandbox must never see the real key")
			assert.NotContains(t, strings.ToLower(headers), "x-echo-key", "a response header carrying the key is removed")
			keys, _ := h.up.seen()
			ev := h.rec.waitFor(t, func(e audit.Event) bool {
				return e.Kind == audit.KindHTTPRequest && e.Target.Model == tt.model && e.Identity.SourceIP == tt.from && e.Outcome.Status == atoi(tt.wantStatus) && e.Outcome.TokensIn == tt.wantTokens[0]
			})
			if tt.wantStatus == "200" {
				require.Len(t, keys, len(keysBefore)+1)
				assert.Equal(t, realKey, keys[len(keys)-1], "the stand-in receives the real key")
				assert.Equal(t, tt.wantTokens, [2]int64{ev.Outcome.TokensIn, ev.Outcome.TokensOut})
				assert.Equal(t, "anthropic", ev.Credential)
				assert.True(t, ev.Decision.Allow)
				if tt.stream {
					assert.Contains(t, resp, "Hello ")
					assert.Contains(t, resp, "message_stop")
				}
			} else {
				assert.Len(t, keys, len(keysBefore), "a denied request never reaches the upstream")
				assert.False(t, ev.Decision.Allow)
				assert.Contains(t, ev.Decision.Reason, "is not allowed for template")
				assert.Contains(t, resp, "sandgate: model")
			}
		})
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}
