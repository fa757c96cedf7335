package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// The clients users have, through Sandgate as directly: the official TypeScript SDKs (1.32.2,
// and 2.4.0 on the legacy revision, pinned to 2026-07-28 and in 'auto' negotiation) run the
// same operations (test/node/sdk-client.mjs, gateway/testdata/sdk/*.json) against three servers
// no one here wrote or that are the SDK's own — the Go SDK's conformance everything-server, the
// TypeScript reference server, a v2 server (test/node/v2-server.mjs) — once directly and once
// through Sandgate, and see the same results, notifications in the same order, but where the
// revision Sandgate speaks to the client differs from the server's (sdkDifferences says which,
// and why: docs/mcp-gateway.md has the table).

// sdkRun is what the runner printed.
type sdkRun struct {
	Connect struct {
		OK              bool   `json:"ok"`
		ProtocolVersion string `json:"protocolVersion"`
		Error           string `json:"error"`
	} `json:"connect"`
	Ops []json.RawMessage `json:"ops"`
}

// sdkClient is one client configuration: an SDK and its negotiation mode.
type sdkClient struct{ sdk, mode string }

var sdkClients = []sdkClient{{"v1", "legacy"}, {"v2", "legacy"}, {"v2", "pin"}, {"v2", "auto"}}

// runSDK runs the scenario file against url as client c from source address src.
func runSDK(t *testing.T, refs referenceServers, c sdkClient, url, scenarios, src string) sdkRun {
	t.Helper()
	root, _ := filepath.Abs("..")
	cmd := exec.CommandContext(t.Context(), refs.node, filepath.Join(root, "test/node/sdk-client.mjs"),
		"--sdk", c.sdk, "--mode", c.mode, "--url", url, "--scenarios", scenarios, "--source-address", src)
	cmd.Dir = filepath.Join(root, "test/node")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "sdk-client: %s", errOut.String())
	var r sdkRun
	require.NoError(t, json.Unmarshal(out.Bytes(), &r), "sdk-client printed: %s", out.String())
	return r
}

// sdkServer is one server the clients run against.
type sdkServer struct {
	name      string
	scenarios string
	start     func(t *testing.T, refs referenceServers) string
}

var sdkServers = []sdkServer{
	{"go-everything", "testdata/sdk/go-everything.json", func(t *testing.T, refs referenceServers) string { return refs.startGo(t) }},
	{"ts-everything", "testdata/sdk/ts-everything.json", func(t *testing.T, refs referenceServers) string { return refs.startTS(t) }},
	{"v2", "testdata/sdk/v2.json", startV2Server},
}

// startV2Server serves test/node/v2-server.mjs (the TypeScript SDK 2.4.0's createMcpHandler).
func startV2Server(t *testing.T, refs referenceServers) string {
	t.Helper()
	addr := freeLoopbackAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	root, _ := filepath.Abs("..")
	cmd := exec.Command(refs.node, "--import", refs.loopbackOnly, filepath.Join(root, "test/node/v2-server.mjs"))
	cmd.Env = append(os.Environ(), "PORT="+port)
	startReferenceServer(t, addr, cmd)
	return "http://" + addr + "/mcp"
}

// sdkDifference is a way a run through Sandgate may differ from the direct one, and why.
type sdkDifference struct {
	// revision: through Sandgate the client speaks another revision (2026-07-28) than directly;
	// the fields only that revision has are compared apart (revisionFields).
	revision bool
	// againstLegacy: the direct connection fails (a client pinned to 2026-07-28 against a legacy
	// server), so ops are compared with the same SDK's legacy run.
	againstLegacy bool
	// better are the ops that work through Sandgate but not directly; worse those that work
	// directly only; failing those that fail both ways, in other words; echo those whose result
	// is the client's own progress token, which the client numbers by its requests (fewer on
	// 2026-07-28, which has no initialize). All by "op name", with why.
	better, worse, failing, echo map[string]string
}

// Why the revisions differ where they do (docs/mcp-gateway.md has the table).
const (
	whyBridged = "the server's request for input reaches a legacy client through Sandgate, which speaks 2026-07-28 " +
		"to the server and asks the client on its own stream; directly, the server's legacy fallback has no stream to ask on"
	whySubscribed = "Sandgate subscribes for a legacy client on the server's 2026-07-28 subscriptions/listen; the server's legacy fallback has no resources/subscribe"
	whyTaskPlain  = "through Sandgate the 2026-07-28 client's task request reaches a legacy server as a plain call, answered in full; directly the pinned client has no server"
	whyRootsAhead = "the server asks for roots outside any call, on its own; a 2026-07-28 client has no channel for that, so it answers from none"
	whyOldTasks   = "the tool needs a 2025-11-25 task (params.task): directly the v2 client has none to make, through Sandgate it is a 2026-07-28 client, for which Sandgate makes none"
	whyNumbered   = "the tool answers the client's own progress token, numbered by the client's requests"
)

// sdkDifferences are the differences the revisions make, by "server sdk mode".
var sdkDifferences = map[string]sdkDifference{
	"go-everything v2 pin": {revision: true, againstLegacy: true, better: map[string]string{"task test_simple_text": whyTaskPlain},
		echo: map[string]string{"callTool test_tool_with_progress": whyNumbered}},
	"go-everything v2 auto": {revision: true, better: map[string]string{"task test_simple_text": whyTaskPlain},
		echo: map[string]string{"callTool test_tool_with_progress": whyNumbered}},
	"ts-everything v2 pin": {revision: true, againstLegacy: true,
		worse: map[string]string{"callTool get-roots-list": whyRootsAhead}, failing: map[string]string{"task simulate-research-query": whyOldTasks}},
	"ts-everything v2 auto": {revision: true,
		worse: map[string]string{"callTool get-roots-list": whyRootsAhead}, failing: map[string]string{"task simulate-research-query": whyOldTasks}},
	"v2 v1 legacy": {better: map[string]string{"callTool deploy": whyBridged, "callTool ask_model": whyBridged,
		"callTool roots": whyBridged, "subscribe ": whySubscribed}},
	"v2 v2 legacy": {better: map[string]string{"callTool deploy": whyBridged, "callTool ask_model": whyBridged,
		"callTool roots": whyBridged, "subscribe ": whySubscribed}},
}

func TestSDKClientsThroughSandgateAsDirectly(t *testing.T) {
	refs := references(t)
	for _, srv := range sdkServers {
		t.Run(srv.name, func(t *testing.T) {
			url := srv.start(t, refs)
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: url, Prefix: config.PrefixNever})
			h.waitReady(t)
			scenarios, _ := filepath.Abs(srv.scenarios)
			direct := map[sdkClient]sdkRun{}
			for _, c := range sdkClients {
				direct[c] = runSDK(t, refs, c, url, scenarios, "127.0.0.1")
			}
			for i, c := range sdkClients {
				t.Run(c.sdk+" "+c.mode, func(t *testing.T) {
					// A sandbox of its own per client: a 2026-07-28 sandbox's upstream session is
					// the sandbox's, and the servers keep state per session.
					through := runSDK(t, refs, c, h.URL(), scenarios, fmt.Sprintf("127.0.0.%d", 10+i))
					diff := sdkDifferences[srv.name+" "+c.sdk+" "+c.mode]
					want := direct[c]
					if !diff.revision {
						assert.Equal(t, want.Connect, through.Connect, "connect")
					}
					require.True(t, through.Connect.OK, "through Sandgate the client connects: %s", through.Connect.Error)
					if diff.againstLegacy {
						require.False(t, want.Connect.OK, "directly the pinned client connects: drop againstLegacy")
						want = direct[sdkClient{c.sdk, "legacy"}]
					}
					require.Len(t, through.Ops, len(want.Ops))
					for i := range want.Ops {
						name := opName(want.Ops[i])
						wantOp, throughOp := want.Ops[i], through.Ops[i]
						if diff.revision {
							wantOp, throughOp = revisionFields(t, wantOp, false), revisionFields(t, throughOp, true)
						}
						if diff.echo[name] != "" {
							wantOp, throughOp = withoutToken(t, wantOp), withoutToken(t, throughOp)
						}
						switch {
						case diff.better[name] != "":
							assert.False(t, opWorked(wantOp), "op %d (%s) now works directly: %s", i, name, wantOp)
							assert.True(t, opWorked(throughOp), "op %d (%s) works through Sandgate (%s): %s", i, name, diff.better[name], throughOp)
						case diff.worse[name] != "":
							assert.True(t, opWorked(wantOp), "op %d (%s) works directly: %s", i, name, wantOp)
							assert.NotEqual(t, string(wantOp), string(throughOp), "op %d (%s) now works through Sandgate: drop the difference", i, name)
						case diff.failing[name] != "":
							assert.False(t, opWorked(wantOp), "op %d (%s) now works directly: %s", i, name, wantOp)
							assert.False(t, opWorked(throughOp), "op %d (%s) now works through Sandgate: %s", i, name, throughOp)
						default:
							assert.JSONEq(t, string(wantOp), string(throughOp), "op %d (%s)", i, name)
						}
					}
				})
			}
		})
	}
}

// revisionFields is op without the fields of 2026-07-28 results (resultType, the caching
// fields, subscribe's honored subscriptions), checking through Sandgate (through) what they
// say: a resource read is private to the sandbox, a subscription is honoured.
func revisionFields(t *testing.T, op json.RawMessage, through bool) json.RawMessage {
	t.Helper()
	var o map[string]any
	require.NoError(t, json.Unmarshal(op, &o))
	res, _ := o["result"].(map[string]any)
	if res == nil {
		return op
	}
	if through && o["op"] == "readResource" {
		assert.Equal(t, "private", res["cacheScope"], "a resource read through Sandgate is the sandbox's own")
	}
	if through && o["op"] == "subscribe" {
		assert.Equal(t, map[string]any{"resourceSubscriptions": []any{o["uri"]}}, res["honored"], "the subscription is honoured")
	}
	for _, k := range []string{"resultType", "ttlMs", "cacheScope", "honored"} {
		delete(res, k)
	}
	out, err := json.Marshal(o)
	require.NoError(t, err)
	return out
}

// withoutToken is op, a tool's result whose one text is a progress token, with the token
// checked to be the client's own, not Sandgate's, and then left out.
func withoutToken(t *testing.T, op json.RawMessage) json.RawMessage {
	t.Helper()
	var o map[string]any
	require.NoError(t, json.Unmarshal(op, &o))
	content := o["result"].(map[string]any)["content"].([]any)
	text := content[0].(map[string]any)
	assert.NotContains(t, text["text"], "sg-", "the upstream sees the client's own progress token")
	text["text"] = "<token>"
	out, err := json.Marshal(o)
	require.NoError(t, err)
	return out
}

// opWorked reports that the op succeeded with a result that is not a tool's error.
func opWorked(op json.RawMessage) bool {
	var o struct {
		OK     bool `json:"ok"`
		Result struct {
			IsError bool `json:"isError"`
			Result  struct {
				IsError bool `json:"isError"`
			} `json:"result"`
		} `json:"result"`
	}
	return json.Unmarshal(op, &o) == nil && o.OK && !o.Result.IsError && !o.Result.Result.IsError
}

func opName(op json.RawMessage) string {
	var o struct {
		Op   string `json:"op"`
		Name string `json:"name"`
	}
	_ = json.Unmarshal(op, &o)
	return fmt.Sprint(o.Op, " ", o.Name)
}
