package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/breaker"
	"github.com/sandgate/sandgate/internal/config"
)

// faultyUpstream is a real mcp-go Streamable HTTP upstream on loopback behind a handler that
// injects faults: a tools/call whose message is "fail-500" gets an HTTP 500, "fail-garbage" a
// 200 whose body is not JSON, "fail-rpc" a JSON-RPC error; while hanging, every POST is
// accepted and never answered (until released or the client gives up). It counts the
// initialize and tools/call requests it receives.
type faultyUpstream struct {
	srv         *httptest.Server
	initialized atomic.Int64
	calls       atomic.Int64
	mu          sync.Mutex
	hang        chan struct{} // non-nil while hanging; closed to release
}

func startFaultyUpstream(t testing.TB) *faultyUpstream {
	t.Helper()
	f := &faultyUpstream{}
	mcpSrv := server.NewStreamableHTTPServer(newUpstreamServer(), server.WithStateful(true))
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Arguments struct {
					Message string `json:"message"`
				} `json:"arguments"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &m)
		switch m.Method {
		case "initialize":
			f.initialized.Add(1)
		case "tools/call":
			f.calls.Add(1)
		}
		f.mu.Lock()
		hang := f.hang
		f.mu.Unlock()
		if hang != nil && r.Method == http.MethodPost {
			select {
			case <-hang:
			case <-r.Context().Done():
				return
			}
		}
		switch m.Params.Arguments.Message {
		case "fail-500":
			http.Error(w, "internal server error", http.StatusInternalServerError)
			return
		case "fail-garbage":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "<html>this is not JSON-RPC</html>")
			return
		case "fail-rpc":
			writeJSON(w, map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32603, "message": "tool exploded"}})
			return
		}
		mcpSrv.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	t.Cleanup(f.release)
	return f
}

func (f *faultyUpstream) URL() string { return f.srv.URL + "/mcp" }

// hangNow makes every later POST wait until release.
func (f *faultyUpstream) hangNow() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hang == nil {
		f.hang = make(chan struct{})
	}
}

func (f *faultyUpstream) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hang != nil {
		close(f.hang)
		f.hang = nil
	}
}

// TestErrorReplyFailsThatCallOnly: one sandbox's calls that the upstream answers with an
// error (HTTP 500, a body that is not JSON-RPC, a JSON-RPC error) fail those calls only. The
// other sandbox's calls to the same upstream, made at the same time, see zero errors; no
// session is torn down (no initialize reaches the upstream after the warm-up) and the
// upstream's breaker stays closed. In both session models: shared was where a 500 used to
// tear down every sandbox's session.
func TestErrorReplyFailsThatCallOnly(t *testing.T) {
	for _, sessions := range []string{config.SessionsShared, config.SessionsPerSandbox} {
		for _, fault := range []string{"fail-500", "fail-garbage", "fail-rpc"} {
			t.Run(sessions+"/"+fault, func(t *testing.T) {
				up := startFaultyUpstream(t)
				h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: up.URL(), Sessions: sessions,
					Breaker: config.UpstreamBreaker{Failures: 2, OpenFor: config.Duration(time.Hour)}})
				h.waitReady(t)
				bad := connectSandbox(t, h.URL(), "127.0.0.2", nil)
				good := connectSandbox(t, h.URL(), "127.0.0.1", nil)
				for _, c := range []*client.Client{bad, good} { // warm-up: per-sandbox sessions are opened
					res, err := callTool(t, c, "echo", map[string]any{"message": "warm"})
					require.NoError(t, err)
					require.False(t, res.IsError, resultText(res))
				}
				inits := up.initialized.Load()

				const n = 20
				var wg sync.WaitGroup
				var badFailed, goodErrors atomic.Int64
				wg.Go(func() {
					for range n {
						res, err := callTool(t, bad, "echo", map[string]any{"message": fault})
						if err != nil || res.IsError {
							badFailed.Add(1)
						}
					}
				})
				wg.Go(func() {
					for i := range n {
						msg := fmt.Sprint("ok-", i)
						res, err := callTool(t, good, "echo", map[string]any{"message": msg})
						if err != nil || res.IsError || resultText(res) != msg {
							goodErrors.Add(1)
						}
					}
				})
				wg.Wait()
				assert.EqualValues(t, n, badFailed.Load(), "every faulty call fails")
				assert.Zero(t, goodErrors.Load(), "the other sandbox's calls to the same upstream are unaffected")
				res, err := callTool(t, bad, "echo", map[string]any{"message": "after"})
				require.NoError(t, err)
				assert.Equal(t, "after", resultText(res), "the faulty sandbox's next good call succeeds")
				assert.Equal(t, inits, up.initialized.Load(), "no session was initialized again")
				assert.Equal(t, breaker.Closed, h.gw.upstreams[0].brk.State(), "an error reply is not a breaker failure")
				assert.NoError(t, h.gw.Ready())

				var upstreamErrors int
				for _, ev := range h.auditEvents(t) {
					if ev.Kind == audit.KindToolsCall && ev.Identity.Sandbox == "full-1" {
						assert.Empty(t, ev.Outcome.Error, "the other sandbox's events show no error")
					}
					if ev.Kind == audit.KindToolsCall && ev.Identity.Sandbox == "full-2" && ev.Outcome.Error != "" {
						upstreamErrors++
					}
				}
				assert.Equal(t, n, upstreamErrors, "each failed call is audited with its error")
			})
		}
	}
}

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestHangingUpstreamOpensItsBreaker: an upstream that accepts and never answers opens its
// breaker after breaker.failures timed-out calls; from then on its calls answer
// upstream_unavailable at once (nothing reaches it, audited as 503 upstream_unavailable) and
// readiness names it, while another sandbox's calls to another upstream, made all along, see
// zero errors. After open_for one probe goes through: a failed one reopens the breaker, a
// successful one closes it.
func TestHangingUpstreamOpensItsBreaker(t *testing.T) {
	healthy := startHTTPUpstream(t, "127.0.0.1:0")
	hanging := startFaultyUpstream(t)
	const failures = 3
	h := startGateway(t, "testdata/policy",
		config.Upstream{Name: "http", URL: healthy.URL()},
		config.Upstream{Name: "rich", URL: hanging.URL(), CallTimeout: config.Duration(300 * time.Millisecond),
			// Long, so that the health check never gives up on the hanging upstream during the test:
			// what opens the breaker is the calls alone.
			ConnectTimeout: config.Duration(time.Minute),
			Breaker:        config.UpstreamBreaker{Failures: failures, OpenFor: config.Duration(time.Minute)}})
	h.waitReady(t)
	// The breaker's clock is the test's, so that the open period ends when the test says.
	clk := &testClock{t: time.Now()}
	rich := h.gw.upstreams[1]
	rich.brk = rich.newBreaker(breaker.WithClock(clk.now))

	victim := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	bystander := connectSandbox(t, h.URL(), "127.0.0.1", nil)
	res, err := callTool(t, victim, "rich_echo", map[string]any{"message": "warm"})
	require.NoError(t, err)
	require.Equal(t, "warm", resultText(res))

	// The bystander calls the healthy upstream throughout.
	stop := make(chan struct{})
	var bystanderCalls, bystanderErrors atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			msg := fmt.Sprint("b-", i)
			res, err := callTool(t, bystander, "http_echo", map[string]any{"message": msg})
			bystanderCalls.Add(1)
			if err != nil || res.IsError || resultText(res) != msg {
				bystanderErrors.Add(1)
			}
		}
	})

	hanging.hangNow()
	start := time.Now()
	for i := range failures {
		res, err := callTool(t, victim, "rich_echo", map[string]any{"message": "hang"})
		require.NoError(t, err)
		require.True(t, res.IsError)
		assert.NotContains(t, resultText(res), "upstream_unavailable", "call %d waited for the upstream and timed out", i)
	}
	require.Equal(t, breaker.Open, rich.brk.State(), "open after %d timeouts", failures)
	timedOut := time.Since(start)
	reached := hanging.calls.Load()
	start = time.Now()
	for range 5 {
		res, err := callTool(t, victim, "rich_echo", map[string]any{"message": "refused"})
		require.NoError(t, err)
		require.True(t, res.IsError)
		assert.Contains(t, resultText(res), "upstream_unavailable")
		assert.Contains(t, resultText(res), "circuit breaker open")
	}
	t.Logf("%d calls to the hanging upstream took %s before the breaker opened; 5 calls took %s after",
		failures, timedOut.Round(time.Millisecond), time.Since(start).Round(time.Microsecond))
	assert.Equal(t, reached, hanging.calls.Load(), "no call reaches an upstream whose breaker is open")
	require.Error(t, h.gw.Ready())
	assert.Contains(t, h.gw.Ready().Error(), "upstream rich: circuit breaker open")

	clk.advance(time.Minute)
	res, err = callTool(t, victim, "rich_echo", map[string]any{"message": "probe-while-hanging"})
	require.NoError(t, err)
	require.True(t, res.IsError)
	assert.Equal(t, reached+1, hanging.calls.Load(), "exactly one probe reached the upstream")
	assert.Equal(t, breaker.Open, rich.brk.State(), "a failed probe reopens the breaker")

	hanging.release()
	clk.advance(time.Minute)
	res, err = callTool(t, victim, "rich_echo", map[string]any{"message": "back"})
	require.NoError(t, err)
	assert.Equal(t, "back", resultText(res), "the probe succeeds")
	assert.Equal(t, breaker.Closed, rich.brk.State(), "and closes the breaker")

	// A bystander call made after the breaker opened and closed, so that it overlaps it all.
	n := bystanderCalls.Load()
	require.Eventually(t, func() bool { return bystanderCalls.Load() >= n+2 }, 10*time.Second, 5*time.Millisecond)
	close(stop)
	wg.Wait()
	assert.Positive(t, bystanderCalls.Load())
	assert.Zero(t, bystanderErrors.Load(), "the other upstream's calls are unaffected")

	var unavailable int
	for _, ev := range h.auditEvents(t) {
		if ev.Kind == audit.KindToolsCall && ev.Target.Upstream == "rich" && ev.Outcome.Error == "upstream_unavailable" {
			assert.Equal(t, http.StatusServiceUnavailable, ev.Outcome.Status)
			assert.True(t, ev.Decision.Allow, "allowed by policy, refused by the breaker")
			unavailable++
		}
	}
	assert.Equal(t, 5, unavailable, "each refused call is audited as upstream_unavailable")
}

func TestJitteredBackoffStaysWithinBounds(t *testing.T) {
	for _, d := range []time.Duration{backoffMin, time.Second, backoffMax} {
		seen := map[time.Duration]bool{}
		for range 200 {
			j := jittered(d)
			require.GreaterOrEqual(t, j, d/2)
			require.Less(t, j, d)
			seen[j] = true
		}
		assert.Greater(t, len(seen), 1, "jitter varies the wait")
	}
}
