package proxy

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
)

// waiter is the stand-in's /until-cancelled (waits for its request to be cancelled) and
// /until-released (waits for release) endpoints.
var waiter = struct{ entered, cancelled, release chan struct{} }{
	make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)}

func init() {
	standInPaths["/until-cancelled"] = func(w http.ResponseWriter, r *http.Request) {
		waiter.entered <- struct{}{}
		select {
		case <-r.Context().Done():
			waiter.cancelled <- struct{}{}
		case <-time.After(30 * time.Second):
		}
	}
	standInPaths["/until-released"] = func(w http.ResponseWriter, r *http.Request) {
		waiter.entered <- struct{}{}
		<-waiter.release
		_, _ = io.WriteString(w, "released")
	}
}

// TestClientGoneCancelsTheUpstreamRequest closes the sandbox's connection while its request
// waits on the upstream: the upstream request is cancelled, on the listener and in a tunnel,
// and the call's event says cancelled.
func TestClientGoneCancelsTheUpstreamRequest(t *testing.T) {
	h := newHarness(t)
	const alpha = "127.0.0.2"
	for _, tc := range []struct {
		name  string
		open  func(t *testing.T) net.Conn
		req   string
		route string
	}{
		{"route", func(t *testing.T) net.Conn { c, _ := h.rawClient(t, alpha); return c },
			"GET /routes/anthropic/until-cancelled HTTP/1.1\r\nHost: sandgate\r\n\r\n", "anthropic"},
		{"intercepted tunnel", func(t *testing.T) net.Conn { return h.openTunnel(t, alpha).c },
			"GET /until-cancelled HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.open(t)
			_, err := io.WriteString(c, tc.req)
			require.NoError(t, err)
			<-waiter.entered
			require.NoError(t, c.Close())
			select {
			case <-waiter.cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream request was not cancelled")
			}
			// Its one event says the sandbox went away before an answer: cancelled, as on the
			// MCP half.
			ev := h.rec.waitFor(t, func(e audit.Event) bool {
				return e.Kind == audit.KindHTTPRequest && e.Target.Path == "/until-cancelled" && e.Target.Route == tc.route
			})
			assert.Equal(t, call.CodeCancelled, ev.Outcome.Error)
			assert.Equal(t, 499, ev.Outcome.Status)
		})
	}
}
