package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// auditCLI runs "sandgate audit …" in-process.
func auditCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := &cliEnv{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
	code = run(context.Background(), env, append([]string{"audit"}, args...))
	return code, out.String(), errOut.String()
}

// auditFixture writes a small log and returns its folder.
func auditFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: dir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	w := audit.NewWriter(sink)
	for i, name := range []string{"sb-1", "sb-2", "sb-1"} {
		ev := audit.Event{Kind: audit.KindToolsCall,
			Identity: identity.Identity{Namespace: "ns", Sandbox: name, Known: true},
			Target:   audit.Target{Upstream: "github", Tool: "create_issue"},
			Decision: audit.Decision{Allow: i != 1, Reason: "reason-" + name}}
		if i == 2 {
			ev.Credential, ev.Decision.WouldDeny = "github", "tool_not_allowed"
		}
		require.NoError(t, w.Record(&ev))
	}
	require.NoError(t, w.Close(context.Background()))
	return dir
}

func TestAuditCommands(t *testing.T) {
	dir := auditFixture(t)
	broken := auditFixture(t)
	log := filepath.Join(broken, audit.ActiveFile)
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(log, bytes.Replace(b, []byte("reason-sb-2"), []byte("reason-sb-9"), 1), 0o600))
	cfg := filepath.Join(t.TempDir(), "sandgate.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("audit:\n  file:\n    dir: "+dir+"\n"), 0o600))

	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOut    []string
		notOut     []string
		wantStderr string
	}{
		{name: "verify of an intact log says ok", args: []string{"verify", "--dir", dir},
			wantOut: []string{"ok: 3 events in 1 file "}},
		{name: "verify reads the folder from the config file", args: []string{"verify", "--config", cfg},
			wantOut: []string{"ok: 3 events in 1 file "}},
		{name: "verify of an edited log exits 3 naming file and line", args: []string{"verify", "--dir", broken},
			wantCode: 3, wantStderr: "audit.log:2: hash does not match"},
		{name: "verify without a log location is a usage error", args: []string{"verify"},
			wantCode: 2, wantStderr: "--config FILE or --dir DIR"},
		{name: "--config and --dir together are a usage error", args: []string{"verify", "--dir", dir, "--config", cfg},
			wantCode: 2, wantStderr: "not both"},
		{name: "query prints a table", args: []string{"query", "--dir", dir},
			wantOut: []string{"TIME", "ns/sb-1", "ns/sb-2", "github/create_issue"}},
		{name: "query filters by sandbox", args: []string{"query", "--dir", dir, "--sandbox", "sb-2"},
			wantOut: []string{"ns/sb-2", "deny"}, notOut: []string{"ns/sb-1"}},
		{name: "query takes the sandbox as NAMESPACE/NAME, as the table prints it", args: []string{"query", "--dir", dir, "--sandbox", "ns/sb-2"},
			wantOut: []string{"ns/sb-2"}, notOut: []string{"ns/sb-1"}},
		{name: "query filters by credential", args: []string{"query", "--dir", dir, "--credential", "github", "-o", "json"},
			wantOut: []string{`"credential":"github"`}, notOut: []string{"sb-2"}},
		{name: "query shows and selects report-only denials", args: []string{"query", "--dir", dir, "--decision", "report"},
			wantOut: []string{"allow (report: tool_not_allowed)"}, notOut: []string{"ns/sb-2"}},
		{name: "query filters by decision and prints JSON lines", args: []string{"query", "--dir", dir, "--decision", "allow", "-o", "json"},
			wantOut: []string{`"sandbox":"sb-1"`, `"hash":"`}, notOut: []string{"sb-2", "TIME"}},
		{name: "query takes a relative --since", args: []string{"query", "--dir", dir, "--since", "1h", "--limit", "1"},
			wantOut: []string{"ns/sb-1"}, notOut: []string{"ns/sb-2"}},
		{name: "query that matches nothing says so on stderr", args: []string{"query", "--dir", dir, "--sandbox", "nobody"},
			wantStderr: "no events match"},
		{name: "query refuses an unknown decision", args: []string{"query", "--dir", dir, "--decision", "maybe"},
			wantCode: 2, wantStderr: "decision"},
		{name: "query refuses a bad --since", args: []string{"query", "--dir", dir, "--since", "yesterday"},
			wantCode: 2, wantStderr: "--since"},
		{name: "query refuses an unknown output format", args: []string{"query", "--dir", dir, "-o", "yaml"},
			wantCode: 2, wantStderr: "table or json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := auditCLI(t, tt.args...)
			assert.Equal(t, tt.wantCode, code, "stderr: %s", errOut)
			for _, s := range tt.wantOut {
				assert.Contains(t, out, s)
			}
			for _, s := range tt.notOut {
				assert.NotContains(t, out, s)
			}
			if tt.wantStderr != "" {
				assert.Contains(t, errOut, tt.wantStderr)
			}
		})
	}
}
