package call_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

type fixedDecider struct{ d policy.Decision }

func (f fixedDecider) Decide(context.Context, *policy.Input) policy.Decision { return f.d }
func (f fixedDecider) Revision() string                                      { return f.d.Revision }

func TestDecisionLogLinksToTheAuditEvent(t *testing.T) {
	dir := t.TempDir()
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: filepath.Join(dir, "audit")})
	require.NoError(t, err)
	writer := audit.NewWriter(sink)
	dlPath := filepath.Join(dir, "decisions.log")
	dl, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: dlPath})
	require.NoError(t, err)
	core, err := call.New(call.Options{Audit: writer, Decisions: dl,
		Policy: fixedDecider{policy.Decision{Allow: false, Reason: "no", Code: "not_echo", Revision: "r1"}}})
	require.NoError(t, err)

	id := identity.Identity{Namespace: "team-a", Sandbox: "sb", Known: true}
	in := &policy.Input{Kind: audit.KindToolsCall, Identity: id, MCP: &policy.MCP{Upstream: "gh", Tool: "x", Arguments: map[string]any{"token": "t"}}}
	_, _, rf := runCall(context.Background(), core, audit.KindToolsCall, id, call.Question{Input: in, Admit: true}, nil)
	require.NotNil(t, rf)

	require.NoError(t, dl.Close())
	require.NoError(t, writer.Close(context.Background()))

	res, err := audit.Query(context.Background(), filepath.Join(dir, "audit"), audit.Filter{})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)

	f, err := os.Open(dlPath)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	var events []logs.EventV1
	for sc.Scan() {
		var ev logs.EventV1
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev))
		events = append(events, ev)
	}
	require.Len(t, events, 1)
	assert.Equal(t, res.Events[0].ID, events[0].DecisionID, "decision_id is the audit event's id")
	assert.Equal(t, "r1", events[0].Bundles[policy.BundleName].Revision)
}
