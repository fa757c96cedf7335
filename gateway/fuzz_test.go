package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

type nopRecorder struct{}

func (nopRecorder) Record(*audit.Event) error { return nil }
func (nopRecorder) Healthy() error            { return nil }

// FuzzHandler feeds random bodies to /mcp: it never panics, and every answer is a JSON-RPC
// message (error or result) or an empty 202 for a notification.
func FuzzHandler(f *testing.F) {
	for _, s := range []string{initBody, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, `[]`, `{`, `null`, `{"id":{}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":1}}`} {
		f.Add(s, false)
		f.Add(s, true)
	}
	eng, err := policy.New(f.Context(), "testdata/policy")
	if err != nil {
		f.Fatal(err)
	}
	res, _ := identity.NewStatic(testIdentities())
	gw, err := New(Options{Config: config.Gateway{MaxBodyBytes: 4096, SessionIdleTimeout: config.Duration(time.Minute)},
		Identity: res, Policy: eng, Audit: nopRecorder{}})
	if err != nil {
		f.Fatal(err)
	}
	h := gw.Handler()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", strings.NewReader(initBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	h.ServeHTTP(rec, req)
	sid := rec.Header().Get("Mcp-Session-Id")
	f.Fuzz(func(t *testing.T, body string, withSession bool) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", strings.NewReader(body))
		req.RemoteAddr = "192.0.2.1:1234"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if withSession {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		h.ServeHTTP(rec, req)
		out := rec.Body.String()
		if rec.Code == http.StatusAccepted && out == "" {
			return
		}
		if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
			out = string(lastEventData([]byte(out)))
		}
		var msg map[string]any
		if err := json.Unmarshal([]byte(out), &msg); err != nil || msg["jsonrpc"] != "2.0" {
			if rec.Code >= 400 { // mcp-go's own plain-text HTTP errors for protocol-level refusals
				return
			}
			t.Fatalf("status %d, body %q is not a JSON-RPC message", rec.Code, out)
		}
	})
}
