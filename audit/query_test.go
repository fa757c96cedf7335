package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/identity"
)

var queryBase = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// queryLog writes six distinguishable events, one minute apart, across rotated files.
func queryLog(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	w := openWriter(t, FileConfig{Dir: dir, MaxSize: 1500}, WithMaxBatch(1))
	sb := func(ns, name, tmpl string) identity.Identity {
		return identity.Identity{Namespace: ns, Sandbox: name, Template: tmpl, Known: true}
	}
	events := []Event{
		{TraceID: "e0", Kind: KindToolsCall, Identity: sb("team-a", "sb-1", "coder"),
			Target: Target{Upstream: "github", Tool: "create_issue"}, Decision: Decision{Allow: true, Reason: "ok"}},
		{TraceID: "e1", Kind: KindToolsCall, Identity: sb("team-a", "sb-2", "coder"),
			Target: Target{Upstream: "github", Tool: "delete_repo"}, Decision: Decision{Reason: "tool not granted"}},
		{TraceID: "e2", Kind: KindHTTPRequest, Identity: sb("team-a", "sb-1", "coder"),
			Target: Target{Method: "POST", Host: "api.anthropic.com", Path: "/v1/messages"}, Decision: Decision{Allow: true}, Credential: "anthropic"},
		{TraceID: "e3", Kind: KindHTTPConnect, Identity: sb("team-b", "sb-3", "research"),
			Target: Target{Host: "evil.example:443"}, Decision: Decision{Reason: "host not allowed"}},
		{TraceID: "e4", Kind: KindToolsList, Identity: sb("team-b", "sb-3", "research"),
			Target: Target{Upstream: "jira"}, Decision: Decision{Allow: true, WouldDeny: "tool_not_allowed"}},
		{TraceID: "e5", Kind: KindHTTPRequest, Identity: identity.Identity{SourceIP: "10.9.9.9"},
			Target: Target{Method: "GET", Host: "API.Anthropic.com:443"}, Decision: Decision{Reason: "anonymous"}},
	}
	for i := range events {
		events[i].Time = queryBase.Add(time.Duration(i) * time.Minute)
		require.NoError(t, w.Record(&events[i]))
	}
	require.NoError(t, w.Close(context.Background()))
	require.Greater(t, len(listFiles(t, dir)), 2, "the fixture spans rotated files")
	return dir
}

func TestQueryFilters(t *testing.T) {
	dir := queryLog(t)
	tests := []struct {
		name   string
		filter Filter
		want   []string
	}{
		{"no filter returns everything oldest first", Filter{}, []string{"e0", "e1", "e2", "e3", "e4", "e5"}},
		{"sandbox selects one sandbox", Filter{Sandbox: "sb-1"}, []string{"e0", "e2"}},
		{"sandbox as NAMESPACE/NAME, as the table prints it", Filter{Sandbox: "team-a/sb-1"}, []string{"e0", "e2"}},
		{"sandbox as NAMESPACE/NAME of another namespace matches nothing", Filter{Sandbox: "team-b/sb-1"}, nil},
		{"credential selects the calls that injected it", Filter{Credential: "anthropic"}, []string{"e2"}},
		{"decision report selects report-only denials, which are allowed", Filter{Decision: DecisionReportOnly}, []string{"e4"}},
		{"namespace selects its sandboxes", Filter{Namespace: "team-b"}, []string{"e3", "e4"}},
		{"template selects its sandboxes", Filter{Template: "coder"}, []string{"e0", "e1", "e2"}},
		{"kind matches exactly", Filter{Kind: string(KindHTTPRequest)}, []string{"e2", "e5"}},
		{"kind without a dot matches the family", Filter{Kind: "mcp"}, []string{"e0", "e1", "e4"}},
		{"kind family does not match a longer prefix", Filter{Kind: "mc"}, nil},
		{"decision deny selects denied calls", Filter{Decision: DecisionDeny}, []string{"e1", "e3", "e5"}},
		{"decision allow selects allowed calls", Filter{Decision: DecisionAllow}, []string{"e0", "e2", "e4"}},
		{"tool matches the MCP tool", Filter{Tool: "delete_repo"}, []string{"e1"}},
		{"host matches case-insensitively and ignores the target's port", Filter{Host: "api.anthropic.com"}, []string{"e2", "e5"}},
		{"host with a port matches only that port", Filter{Host: "evil.example:443"}, []string{"e3"}},
		{"host with another port matches nothing", Filter{Host: "evil.example:80"}, nil},
		{"since is inclusive", Filter{Since: queryBase.Add(4 * time.Minute)}, []string{"e4", "e5"}},
		{"until is exclusive", Filter{Until: queryBase.Add(2 * time.Minute)}, []string{"e0", "e1"}},
		{"since and until select a window", Filter{Since: queryBase.Add(time.Minute), Until: queryBase.Add(3 * time.Minute)}, []string{"e1", "e2"}},
		{"limit keeps the newest matches, oldest first", Filter{Limit: 2}, []string{"e4", "e5"}},
		{"limit applies after the other filters", Filter{Decision: DecisionDeny, Limit: 2}, []string{"e3", "e5"}},
		{"a negative limit returns all matches", Filter{Limit: -1, Namespace: "team-a"}, []string{"e0", "e1", "e2"}},
		{"filters combine", Filter{Namespace: "team-a", Kind: "mcp", Decision: DecisionAllow}, []string{"e0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Query(context.Background(), dir, tt.filter)
			require.NoError(t, err)
			var got []string
			for _, ev := range res.Events {
				got = append(got, ev.TraceID)
			}
			assert.Equal(t, tt.want, got)
			if tt.filter.Limit > 0 {
				assert.GreaterOrEqual(t, res.Matched, len(got), "matched counts beyond the limit")
			}
		})
	}
}

func TestQueryDefaultLimitIsTheNewestHundred(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 150)
	res, err := Query(context.Background(), dir, Filter{})
	require.NoError(t, err)
	require.Len(t, res.Events, DefaultLimit)
	assert.Equal(t, "t50", res.Events[0].TraceID)
	assert.Equal(t, "t149", res.Events[DefaultLimit-1].TraceID)
	assert.Equal(t, 150, res.Matched)
}

func TestQueryRejectsImpossibleFilters(t *testing.T) {
	tests := []struct {
		name   string
		filter Filter
		want   string
	}{
		{"an unknown decision names the field", Filter{Decision: "maybe"}, "decision"},
		{"a sandbox of another namespace than --namespace", Filter{Namespace: "team-a", Sandbox: "team-b/sb-3"}, "namespace"},
		{"since after until is refused", Filter{Since: queryBase, Until: queryBase.Add(-time.Hour)}, "since"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Query(context.Background(), t.TempDir(), tt.filter)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestQuerySkipsAndCountsMalformedLines(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 3)
	path := filepath.Join(dir, ActiveFile)
	lines := readLines(t, path)
	lines = append(lines[:1], append([][]byte{[]byte("not json")}, lines[1:]...)...)
	writeLines(t, path, lines)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"id":"cut`)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	res, err := Query(context.Background(), dir, Filter{})
	require.NoError(t, err)
	assert.Len(t, res.Events, 3)
	assert.Equal(t, 2, res.Malformed)
}

func TestQueryStopsWhenTheContextEnds(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 2100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Query(ctx, dir, Filter{})
	assert.ErrorIs(t, err, context.Canceled)
}

func TestParseTimeFlag(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		in      string
		want    time.Time
		wantErr bool
	}{
		{name: "empty means unbounded", in: "", want: time.Time{}},
		{name: "RFC 3339 is taken as is", in: "2025-05-31T08:30:00Z", want: time.Date(2025, 5, 31, 8, 30, 0, 0, time.UTC)},
		{name: "RFC 3339 with an offset", in: "2025-05-31T10:30:00+02:00", want: time.Date(2025, 5, 31, 8, 30, 0, 0, time.UTC)},
		{name: "a duration means that long ago", in: "90m", want: now.Add(-90 * time.Minute)},
		{name: "a negative duration is refused", in: "-1h", wantErr: true},
		{name: "anything else is refused", in: "yesterday", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTimeFlag(tt.in, now)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.True(t, tt.want.Equal(got), "got %s", got)
		})
	}
}
