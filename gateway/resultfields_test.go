package gateway

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/catalogs"
	"github.com/sandgate/sandgate/internal/config"
)

// Fields of a result that mcp-go's typed results drop or cannot hold reach the sandbox as the
// upstream sent them (issue 35): a completion's hasMore: false (omitempty in mcp-go), a list
// result's own _meta.

// A completion result reaches the sandbox as the TypeScript reference server wrote it,
// hasMore: false included.
func TestCompletionResultIsTheUpstreams(t *testing.T) {
	url := references(t).startTS(t)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: url, Prefix: config.PrefixNever})
	h.waitReady(t)
	params := map[string]any{"ref": map[string]any{"type": "ref/prompt", "name": "completable-prompt"},
		"argument": map[string]any{"name": "department", "value": "E"}}
	direct := openRawSession(t, url, "127.0.0.1").call("completion/complete", params)
	through := openRawSession(t, h.URL(), "127.0.0.2").call("completion/complete", params)
	require.Contains(t, string(direct), `"hasMore":false`, "the reference server says there is no more")
	assert.JSONEq(t, string(direct), string(through))
}

// A list result's own _meta reaches each sandbox that sees one of the entries of the upstream
// that sent it; a sandbox that sees none of them gets none of its _meta.
func TestListResultMetaReachesTheSandboxes(t *testing.T) {
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixAlways})
	h.waitReady(t)
	full := openRawSession(t, h.URL(), "127.0.0.2")
	narrow := openRawSession(t, h.URL(), "127.0.0.3") // policy: only "echo"
	for _, k := range []listKind{listTools, listPrompts, listResources, listTemplates} {
		t.Run(string(k.method), func(t *testing.T) {
			want := resultMember(t, up.catalog[string(k.method)], "_meta")
			require.NotNil(t, want, "the fixture's %s has a _meta", k.method)
			assert.JSONEq(t, string(want), string(resultMember(t, full.call(string(k.method), nil), "_meta")))
			narrowMeta := resultMember(t, narrow.call(string(k.method), nil), "_meta")
			if k == listTools {
				assert.JSONEq(t, string(want), string(narrowMeta), "the narrow sandbox sees echo")
			} else {
				assert.Nil(t, narrowMeta, "the narrow sandbox sees none of the upstream's %s", k.array)
			}
		})
	}
}

// A list's _meta survives a restart while its upstream is down: it is saved with the last known
// catalog.
func TestListResultMetaOfTheLastKnownCatalog(t *testing.T) {
	store := catalogs.NewFile(filepath.Join(t.TempDir(), catalogs.FileName))
	withStore := func(o *Options) { o.Catalogs = store }
	up := startRawUpstream(t, "testdata/rich-catalog.json")
	ucfg := config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever, ConnectTimeout: config.Duration(time.Second)}
	startGatewayWith(t, "testdata/policy", withStore, ucfg).waitReady(t)
	up.srv.Close() // down from now on

	h := startGatewayWith(t, "testdata/policy", withStore, ucfg)
	require.Eventually(t, func() bool { return h.gw.Tried() == nil }, 30*time.Second, 10*time.Millisecond)
	require.Error(t, h.gw.Ready(), "the upstream is down")
	got := resultMember(t, openRawSession(t, h.URL(), "127.0.0.2").call(string(mcp.MethodToolsList), nil), "_meta")
	assert.JSONEq(t, string(resultMember(t, up.catalog[string(mcp.MethodToolsList)], "_meta")), string(got))
}

// resultMember is member name of obj, as written.
func resultMember(t *testing.T, obj json.RawMessage, name string) json.RawMessage {
	t.Helper()
	var res map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(obj, &res))
	return res[name]
}
