package suggest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/suggest"
	"github.com/sandgate/sandgate/policy"
)

// shippedFolder is a copy of the shipped policies (tests included) with the example's data,
// triage-agent in report-only mode.
func shippedFolder(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join("..", "..", "policies", "*"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		if filepath.Base(f) == "data.yaml" {
			b = bytes.Replace(b, []byte("  triage-agent:\n"), []byte("  triage-agent:\n    enforce: false\n"), 1)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644))
	}
	return dir
}

var (
	triage = identity.Identity{Namespace: "agents", Sandbox: "triage-1", Template: "triage-agent", Known: true}
	coder  = identity.Identity{Namespace: "agents", Sandbox: "coder-1", Template: "coding-agent", Known: true}
)

func toolCall(id identity.Identity, upstream, tool string) *policy.Input {
	return &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{Upstream: upstream, Tool: tool}}
}

func model(id identity.Identity, name string, maxTokens int64) *policy.Input {
	return &policy.Input{Kind: audit.KindHTTPRequest, Identity: id, HTTP: &policy.HTTP{Method: "POST", Host: "api.anthropic.com",
		Port: 443, Path: "/v1/messages", Route: "anthropic", Model: name, MaxTokens: maxTokens}}
}

// record decides the calls under the folder and writes them to a decision log, as serve does.
func record(t *testing.T, dir string, calls []*policy.Input) string {
	t.Helper()
	eng, err := policy.New(context.Background(), dir)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path, QueueSize: len(calls) + 1})
	require.NoError(t, err)
	for i, in := range calls {
		l.Record(fmt.Sprintf("ev-%02d", i), in, eng.Decide(context.Background(), in))
	}
	require.NoError(t, l.Close())
	return path
}

func TestSuggestLiftsTheDenialsAndRemovesWhatWasNotUsed(t *testing.T) {
	dir := shippedFolder(t)
	log := record(t, dir, []*policy.Input{
		toolCall(triage, "everything", "echo"), // used
		toolCall(triage, "everything", "add"),  // denied: tool_not_allowed
		toolCall(triage, "everything", "add"),  // again
		{Kind: audit.KindHTTPConnect, Identity: triage, HTTP: &policy.HTTP{Method: "CONNECT", Host: "proxy.golang.org", Port: 443, MaxTokens: -1}},
		model(triage, "claude-haiku-4-5", 100),   // used
		model(triage, "claude-sonnet-4-5", 5000), // a model, and over the cap
		{Kind: audit.KindToolsCall, Identity: triage, MCP: &policy.MCP{Tool: "gone", NotFound: true, Hidden: true}},
		toolCall(coder, "everything", "add"), // another template
	})
	s, err := suggest.Suggest(context.Background(), suggest.Options{Template: "triage-agent", PolicyDir: dir}, suggest.FromDecisionLog(log))
	require.NoError(t, err)

	assert.Equal(t, 7, s.Decisions)
	assert.True(t, s.ReportOnly)
	var added, removed []string
	for _, e := range s.Add {
		added = append(added, e.String())
		assert.Empty(t, e.NoTest, "%s has a test", e)
	}
	for _, e := range s.Remove {
		removed = append(removed, e.String())
	}
	assert.Equal(t, []string{"tools everything/add", "hosts proxy.golang.org", "models anthropic/claude-sonnet-4-5", "max_tokens anthropic 5000"}, added)
	assert.Equal(t, []string{"tools github/get_issue", "tools github/list_issues", "tools github/search_issues"}, removed)
	add := s.Add[0].Evidence
	assert.Equal(t, 2, add.Count)
	assert.Equal(t, "ev-01", add.Example)
	assert.Equal(t, []string{"tool_not_allowed"}, add.Codes)
	require.Len(t, s.Unlifted, 1)
	assert.Equal(t, "not_found", s.Unlifted[0].Code)

	var data struct {
		Templates map[string]struct {
			Enforce *bool
			Tools   []struct {
				Upstream string
				Allow    []string
			}
			Hosts  []string
			Models map[string]struct {
				Allow     []string
				MaxTokens int `json:"max_tokens"`
			}
		}
	}
	require.NoError(t, yaml.Unmarshal([]byte(s.Data), &data))
	tr := data.Templates["triage-agent"]
	require.Len(t, tr.Tools, 1, "the github entry allowed nothing that was used: it goes whole")
	assert.Equal(t, []string{"echo", "add"}, tr.Tools[0].Allow)
	assert.Equal(t, []string{"proxy.golang.org"}, tr.Hosts)
	assert.Equal(t, []string{"claude-haiku-4-5", "claude-sonnet-4-5"}, tr.Models["anthropic"].Allow)
	assert.Equal(t, 5000, tr.Models["anthropic"].MaxTokens)
	assert.Len(t, data.Templates["coding-agent"].Tools, 2, "another template is left alone")
	assert.Contains(t, s.Data, "# Data the shipped policies read.", "the file's comments stay")
	assert.Contains(t, s.Diff, `+        allow: ["echo", "add"] # suggested: +add`)
	assert.Contains(t, s.Diff, `-      - upstream: github`)
	assert.True(t, strings.HasSuffix(s.Data, "# suggested: raised to 5000\n"), "the file's own ending stands")

	out := filepath.Join(t.TempDir(), "next")
	require.NoError(t, s.Write(dir, out))
	sum, err := policy.RunTests(context.Background(), os.Stderr, false, out)
	require.NoError(t, err)
	assert.True(t, sum.OK())
	assert.Equal(t, 7, strings.Count(s.Tests, "\ntest_"), "a test per addition and per removal:\n%s", s.Tests)
	assert.Error(t, s.Write(dir, out), "an existing folder is not overwritten")
}

// A removal the template's allowed calls depend on is never proposed, and the removals are
// withheld when the candidate would deny an allowed call.
func TestSuggestKeepsWhatIsUsedThroughAPattern(t *testing.T) {
	dir := shippedFolder(t)
	who := identity.Identity{Namespace: "agents", Sandbox: "coder-1", Template: "coding-agent", Known: true}
	log := record(t, dir, []*policy.Input{toolCall(who, "everything", "get-time"), toolCall(who, "github", "list_issues")})
	s, err := suggest.Suggest(context.Background(), suggest.Options{Template: "coding-agent", PolicyDir: dir}, suggest.FromDecisionLog(log))
	require.NoError(t, err)
	for _, e := range s.Remove {
		assert.NotEqual(t, "tools everything/get-*", e.String(), "get-time used it")
		assert.NotEqual(t, "tools github/list_*", e.String(), "list_issues used it")
	}
	assert.Empty(t, s.Add)
	assert.Empty(t, s.Withheld)
}

func TestSuggestFromTheAuditLog(t *testing.T) {
	dir := shippedFolder(t)
	auditDir := t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: auditDir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	w := audit.NewWriter(sink)
	now := time.Now()
	for i, ev := range []audit.Event{
		{Kind: audit.KindHTTPConnect, Identity: triage, Target: audit.Target{Host: "proxy.golang.org"},
			Decision: audit.Decision{Allow: true, Reason: "host not allowed", WouldDeny: "host_not_allowed"}},
		{Kind: audit.KindToolsCall, Identity: triage, Target: audit.Target{Upstream: "everything", Tool: "echo"}, Decision: audit.Decision{Allow: true}},
		{Kind: audit.KindToolsCall, Identity: triage, Target: audit.Target{Upstream: "everything", Tool: "add"},
			Decision: audit.Decision{Reason: "no"}, Outcome: audit.Outcome{Error: "rate_limited"}},
	} {
		ev.Time = now.Add(time.Duration(i) * time.Second)
		require.NoError(t, w.Record(&ev))
	}
	require.NoError(t, w.Close(context.Background()))
	s, err := suggest.Suggest(context.Background(), suggest.Options{Template: "triage-agent", PolicyDir: dir}, suggest.FromAuditLog(auditDir))
	require.NoError(t, err)
	require.Len(t, s.Add, 1)
	assert.Equal(t, "hosts proxy.golang.org", s.Add[0].String())
	require.Len(t, s.Unlifted, 1, "a rate limit is not a data change")
	assert.Equal(t, "rate_limited", s.Unlifted[0].Code)
	assert.Contains(t, s.Tests, "test_allows_hosts_proxy_golang_org")
}

// A cap raised for a model keeps the model: a request over the cap is the model's use.
func TestSuggestRaisesACapWithoutRemovingItsModel(t *testing.T) {
	dir := shippedFolder(t)
	log := record(t, dir, []*policy.Input{model(triage, "claude-haiku-4-5", 8192)})
	s, err := suggest.Suggest(context.Background(), suggest.Options{Template: "triage-agent", PolicyDir: dir}, suggest.FromDecisionLog(log))
	require.NoError(t, err)
	require.Len(t, s.Add, 1)
	assert.Equal(t, "max_tokens anthropic 8192", s.Add[0].String())
	for _, e := range s.Remove {
		assert.NotEqual(t, "models", e.Section, "%s", e)
	}
	assert.Empty(t, s.Unlifted, "the raised cap lifts the denial")
	assert.Contains(t, s.Tests, "test_allows_max_tokens_anthropic_8192")
}
