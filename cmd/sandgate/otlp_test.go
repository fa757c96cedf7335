package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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
	"github.com/sandgate/sandgate/test/otelcoltest"
)

// otlpServe is one "sandgate serve" exporting its audit log to a Collector; start and stop it
// as often as the test likes, on the same ports and audit folder.
type otlpServe struct {
	t                        *testing.T
	cfg                      string
	mcp, proxy, admin, audit string
	errOut                   *syncBuffer
	cancel                   context.CancelFunc
	done                     chan int
}

func newOTLPServe(t *testing.T, col *otelcoltest.Collector, githubURL, modelURL string) *otlpServe {
	dir := t.TempDir()
	s := &otlpServe{t: t, mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), audit: filepath.Join(dir, "audit")}
	writeFile(t, dir, "anthropic", "sk-ant-test-value")
	writeFile(t, dir, "otlp-token", "collector-token")
	s.cfg = writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit:
  file: {dir: %q, fsync: never, max_size_mb: 1}
  otlp: {endpoint: %q, protocol: grpc, insecure: true, batch: 64, timeout: 2s,
         header_credential: {name: otlp-token}}
credentials:
  - {name: anthropic, file: anthropic}
  - {name: otlp-token, file: otlp-token}
gateway:
  upstreams:
    - {name: github, url: %q, prefix: never}
proxy:
  routes:
    - {name: anthropic, upstream: %q, api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
shutdown: {delay: 0s}
log: {level: warn, format: text}
`, s.mcp, s.proxy, s.admin, repoPath(t, "policies"), s.audit, col.GRPCEndpoint(), githubURL, modelURL, coderAddr))
	return s
}

// start runs serve and waits until it is ready.
func (s *otlpServe) start() {
	t := s.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done, s.errOut = cancel, make(chan int, 1), &syncBuffer{}
	env := &cliEnv{stdout: io.Discard, stderr: s.errOut, getenv: func(k string) string {
		if k == "SANDGATE_REPLICA" {
			return "otlp-test"
		}
		return ""
	}}
	done := s.done
	go func() { done <- run(ctx, env, []string{"serve", "--config", s.cfg}) }()
	t.Cleanup(s.stop)
	require.Eventually(t, func() bool { code, _ := s.get("/readyz"); return code == http.StatusOK }, 30*time.Second, 50*time.Millisecond,
		"serve not ready: %s", s.errOut.String())
}

// stop ends serve gracefully and waits for it.
func (s *otlpServe) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	select {
	case code := <-s.done:
		assert.Equal(s.t, 0, code, s.errOut.String())
	case <-time.After(40 * time.Second):
		s.t.Errorf("serve did not stop: %s", s.errOut.String())
	}
	s.cancel = nil
}

func (s *otlpServe) get(path string) (int, string) {
	resp, err := http.Get("http://" + s.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// fileLineIDs is every line's event ID in the audit folder, the writer's own records included.
func fileLineIDs(t *testing.T, dir string) map[string]audit.Event {
	t.Helper()
	out := map[string]audit.Event{}
	res, err := audit.Query(context.Background(), dir, audit.Filter{Limit: -1})
	require.NoError(t, err)
	for _, ev := range res.Events {
		out[ev.ID] = ev
	}
	return out
}

// bothHalvesLoad sends, one after another, a model request through the proxy's route and a tool
// call through the MCP gateway, each answered call counted; a call that fails (serve is being
// restarted) is retried with a new session. Paced, not flat out: a steady stream of events.
type bothHalvesLoad struct {
	s        *otlpServe
	answered atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startLoad(s *otlpServe) *bothHalvesLoad {
	l := &bothHalvesLoad{s: s, stop: make(chan struct{})}
	l.wg.Go(l.run)
	return l
}

func (l *bothHalvesLoad) run() {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	http := fromAddr(coderAddr)
	var session *client.Client
	defer func() {
		if session != nil {
			_ = session.Close()
		}
	}()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		body := `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`
		if resp, err := http.Post("http://"+l.s.proxy+"/routes/anthropic/v1/messages", "application/json", strings.NewReader(body)); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			l.answered.Add(1)
		}
		if session == nil {
			session = l.session()
		}
		if session != nil && l.callTool(session) {
			l.answered.Add(1)
		} else if session != nil {
			_ = session.Close()
			session = nil
		}
	}
}

func (l *bothHalvesLoad) session() *client.Client {
	c, err := client.NewStreamableHttpClient("http://"+l.s.mcp+"/mcp", transport.WithHTTPBasicClient(fromAddr(coderAddr)))
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c.Start(ctx) != nil {
		return nil
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "otlp-load", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		_ = c.Close()
		return nil
	}
	return c
}

func (l *bothHalvesLoad) callTool(c *client.Client) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := mcp.CallToolRequest{}
	req.Params.Name = "get_issue"
	_, err := c.CallTool(ctx, req)
	return err == nil
}

func (l *bothHalvesLoad) end() {
	close(l.stop)
	l.wg.Wait()
}

// waitAnswered waits until the load has had n more calls answered.
func (l *bothHalvesLoad) waitAnswered(t *testing.T, n int64, msg string) {
	t.Helper()
	from := l.answered.Load()
	require.Eventually(t, func() bool { return l.answered.Load() >= from+n }, 60*time.Second, 10*time.Millisecond, msg)
}

// metricValue reads one sample of /metrics ("" when absent).
func metricValue(body, series string) string {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestOTLPExportThroughCollectorAndSandgateRestarts is the acceptance test: steady load
// through both halves, the Collector killed mid-run and started again, Sandgate restarted once
// while the Collector is away; in the end the set of event IDs the Collector received equals the
// audit file's (repeats allowed, bounded), and one record's attributes match its event.
func TestOTLPExportThroughCollectorAndSandgateRestarts(t *testing.T) {
	col := otelcoltest.Start(t, otelcoltest.WithBearerToken("collector-token"))
	s := newOTLPServe(t, col, githubUpstream(t), modelAPI(t))
	s.start()
	load := startLoad(s)
	t.Cleanup(func() {
		select {
		case <-load.stop:
		default:
			load.end()
		}
	})

	col.WaitFor(t, 60*time.Second, "events reach the Collector", func(r []otelcoltest.Record) bool { return len(r) >= 30 })

	col.Kill() // mid-run, exports in flight: what it acknowledged is in its file, the rest is resent
	load.waitAnswered(t, 30, "calls are answered while the Collector is away")
	require.Eventually(t, func() bool {
		code, body := s.get("/readyz")
		return code == http.StatusOK && strings.Contains(body, "audit otlp export")
	}, 30*time.Second, 50*time.Millisecond, "readiness stays, with a degraded note")
	_, metrics := s.get("/metrics")
	failed, _ := strconv.Atoi(metricValue(metrics, `sandgate_audit_export_records_total{destination="otlp",result="failed"}`))
	assert.Positive(t, failed, "failed exports are counted:\n%s", grepMetrics(metrics, "sandgate_audit_export"))
	assert.NotEmpty(t, metricValue(metrics, `sandgate_audit_export_lag_seconds{destination="otlp"}`), grepMetrics(metrics, "sandgate_audit_export"))
	assert.NotEmpty(t, metricValue(metrics, `sandgate_audit_export_lag_bytes{destination="otlp"}`), grepMetrics(metrics, "sandgate_audit_export"))

	// Sandgate restarts while the Collector is still away: its shutdown cannot send the tail,
	// the next start continues from the cursor.
	s.stop()
	assert.Contains(t, s.errOut.String(), "audit log not fully exported over OTLP on shutdown", "the Collector is still away")
	s.start()
	load.waitAnswered(t, 30, "calls are answered after the restart")

	col.Restart()
	load.waitAnswered(t, 30, "calls are answered after the Collector is back")
	load.end()
	s.stop() // flushes the writer and sends the tail to the Collector

	file := fileLineIDs(t, s.audit)
	want := map[string]bool{}
	for _, p := range logLines(t, s.audit) {
		want[lineIDOf(t, p)] = true
	}
	require.Greater(t, len(file), 200, "a steady load through both halves")
	recs := col.WaitFor(t, 60*time.Second, "every line of the audit log reaches the Collector", func(r []otelcoltest.Record) bool {
		got := otlpIDs(r)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	got := otlpIDs(recs)
	extra, repeats := 0, 0
	for id, n := range got {
		if !want[id] {
			extra++
		}
		repeats += n - 1
	}
	assert.Zero(t, extra, "the Collector has no event the file lacks")
	assert.LessOrEqual(t, repeats, 2*64, "repeats stay within a batch per interrupted export")
	t.Logf("audit lines %d, events %d, records received %d, repeats %d", len(want), len(file), len(recs), repeats)

	kinds := map[audit.Kind]bool{}
	for _, r := range recs {
		ev, ok := file[fmt.Sprint(r.Attributes[audit.AttrEventID])]
		if !ok || kinds[ev.Kind] || (ev.Kind != audit.KindHTTPRequest && ev.Kind != audit.KindToolsCall) {
			continue
		}
		kinds[ev.Kind] = true
		checkRecordMatchesEvent(t, r, ev)
	}
	assert.Len(t, kinds, 2, "a model request and a tool call were checked")
}

// checkRecordMatchesEvent: the record the Collector received says what the event says.
func checkRecordMatchesEvent(t *testing.T, r otelcoltest.Record, ev audit.Event) {
	t.Helper()
	var body audit.Event
	require.NoError(t, json.Unmarshal([]byte(r.Body), &body))
	assert.Equal(t, ev.Hash, body.Hash, "the body is the event's line")
	assert.Equal(t, string(ev.Kind), r.EventName)
	assert.True(t, r.Timestamp.Equal(ev.Time))
	assert.Equal(t, "INFO", r.SeverityText)
	want := map[string]any{
		audit.AttrEventID: ev.ID, audit.AttrEventHash: ev.Hash, "client.address": ev.Identity.SourceIP,
		audit.AttrSandbox: "coder-1", audit.AttrNamespace: "agents", audit.AttrTemplate: "coding-agent",
		audit.AttrDecision: "allow", audit.AttrReason: ev.Decision.Reason, audit.AttrPolicyRevision: ev.Decision.PolicyRevision,
		"http.response.status_code": int64(ev.Outcome.Status),
	}
	switch ev.Kind {
	case audit.KindHTTPRequest:
		want["http.request.method"] = "POST"
		want["url.path"] = ev.Target.Path
		want["gen_ai.request.model"] = "claude-haiku-4-5"
		want["gen_ai.usage.input_tokens"] = ev.Outcome.TokensIn
		want[audit.AttrRoute] = "anthropic"
		want[audit.AttrCredential] = "anthropic"
	case audit.KindToolsCall:
		want["mcp.method.name"] = "tools/call"
		want["gen_ai.tool.name"] = "get_issue"
		want[audit.AttrUpstream] = "github"
	}
	for k, v := range want {
		assert.Equal(t, v, r.Attributes[k], "%s of %s", k, ev.Kind)
	}
	assert.Equal(t, "sandgate", r.Resource["service.name"])
	assert.Equal(t, "otlp-test", r.Resource["service.instance.id"])
}

// logLines is every line of the audit log, oldest file first.
func logLines(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "audit*.log"))
	require.NoError(t, err)
	var out []string
	for _, f := range files {
		out = append(out, readFileLines(t, f)...)
	}
	return out
}

func lineIDOf(t *testing.T, line string) string {
	t.Helper()
	var v struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(line), &v), line)
	return v.ID
}

func otlpIDs(recs []otelcoltest.Record) map[string]int {
	ids := map[string]int{}
	for _, r := range recs {
		if id, ok := r.Attributes[audit.AttrEventID].(string); ok {
			ids[id]++
		}
	}
	return ids
}

func grepMetrics(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func readFileLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
