package docs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

const (
	coder  = "127.0.0.2" // coder-1, coding-agent: claude-haiku-4-5 and claude-sonnet-4-5
	triage = "127.0.0.3" // triage-1, triage-agent: claude-haiku-4-5 only
	// What `make run` writes into var/secrets/anthropic without $ANTHROPIC_API_KEY.
	placeholderKey = "sk-ant-placeholder-not-a-real-key"
)

// checkOfflineTour is the README's egress tour without internet access: both egress modes get
// the stand-in's answer with the key Sandgate injected (the stand-in refuses any other key), and
// each call is one audit event naming api.anthropic.com and the credential; a model the template
// may not use never reaches the stand-in.
func checkOfflineTour(t *testing.T, tr *tour) {
	proxyAddr := tr.ports["127.0.0.1:3128"]
	caPEM, err := os.ReadFile(filepath.Join(tr.root, "var", "ca", "ca.crt"))
	require.NoError(t, err)

	t.Run("the base-URL route answers from the stand-in", func(t *testing.T) {
		status, body := messagesCall(t, sandboxClient(t, coder, "", nil), "http://"+proxyAddr+"/routes/anthropic/v1/messages", "claude-haiku-4-5", false)
		require.Equal(t, http.StatusOK, status, "%s\nmake run:\n%s", body, tr.log)
		assertAnswer(t, body, "claude-haiku-4-5")
	})
	t.Run("the forward proxy intercepts and answers from the stand-in", func(t *testing.T) {
		status, body := messagesCall(t, sandboxClient(t, coder, proxyAddr, caPEM), "https://api.anthropic.com/v1/messages", "claude-sonnet-4-5", false)
		require.Equal(t, http.StatusOK, status, "%s\nmake run:\n%s", body, tr.log)
		assertAnswer(t, body, "claude-sonnet-4-5")
	})
	t.Run("a streamed answer passes both ways", func(t *testing.T) {
		status, body := messagesCall(t, sandboxClient(t, coder, proxyAddr, caPEM), "https://api.anthropic.com/v1/messages", "claude-haiku-4-5", true)
		require.Equal(t, http.StatusOK, status, body)
		assert.Contains(t, body, "event: message_stop")
		assert.Contains(t, body, `"text":" stand-in"`)
	})
	t.Run("a model the template may not use is refused", func(t *testing.T) {
		status, body := messagesCall(t, sandboxClient(t, triage, "", nil), "http://"+proxyAddr+"/routes/anthropic/v1/messages", "claude-sonnet-4-5", false)
		assert.Equal(t, http.StatusForbidden, status, body)
		assert.Contains(t, body, "model_not_allowed")
	})
	t.Run("each call is one event naming the host and the injected credential", func(t *testing.T) {
		var events []audit.Event
		require.Eventually(t, func() bool {
			res, err := audit.Query(context.Background(), filepath.Join(tr.root, "var", "audit"), audit.Filter{Sandbox: "coder-1", Kind: "http.request", Limit: -1})
			require.NoError(t, err)
			events = res.Events
			return len(events) >= 3
		}, 30*time.Second, 20*time.Millisecond, "the three coder-1 requests' events")
		var routed, intercepted int
		for _, ev := range events {
			if ev.Outcome.Status != http.StatusOK || ev.Credential != "anthropic" || !ev.Decision.Allow {
				continue
			}
			switch {
			case ev.Target.Route == "anthropic":
				routed++
			case ev.Target.Host == "api.anthropic.com":
				intercepted++
			}
		}
		assert.GreaterOrEqual(t, routed, 1, "a route event: %+v", events)
		assert.GreaterOrEqual(t, intercepted, 2, "intercepted events: %+v", events)
	})
}

// sandboxClient calls as the sandbox at source address from: directly, or through the forward
// proxy trusting Sandgate's CA.
func sandboxClient(t *testing.T, from, proxyAddr string, caPEM []byte) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
	if proxyAddr != "" {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: proxyAddr})
		roots := x509.NewCertPool()
		require.True(t, roots.AppendCertsFromPEM(caPEM))
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// messagesCall sends a Messages API request with the sandbox's placeholder key.
func messagesCall(t *testing.T, c *http.Client, url, model string, stream bool) (int, string) {
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 64, "stream": stream,
		"messages": []any{map[string]string{"role": "user", "content": "hi"}}})
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(b)))
	require.NoError(t, err)
	req.Header.Set("x-api-key", "placeholder")
	req.Header.Set("content-type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// assertAnswer checks a Messages API answer from the stand-in, which it gives only to the key
// Sandgate holds, and which never carries that key.
func assertAnswer(t *testing.T, body, model string) {
	var msg struct {
		Type    string
		Model   string
		Content []struct{ Type, Text string }
		Usage   struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body), &msg), body)
	assert.Equal(t, "message", msg.Type)
	assert.Equal(t, model, msg.Model)
	require.Len(t, msg.Content, 1)
	assert.Contains(t, msg.Content[0].Text, "local stand-in model API")
	assert.Contains(t, msg.Content[0].Text, "You said: hi")
	assert.Positive(t, msg.Usage.OutputTokens)
	assert.NotContains(t, body, placeholderKey)
}
