package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The example inputs (examples/inputs, referenced from README.md and docs/policies.md) get the
// decision their names promise from the shipped policies, through `sandgate policy eval`:
// KIND-allowed.json or KIND-denied[-CODE].json, where KIND is input.kind with '_' for '.' and
// without "mcp_" (tools_call, http_request), and CODE, with '-' for '_', is part of the
// decision's code.
func TestExampleInputsGetTheDecisionTheirNamesSay(t *testing.T) {
	files, err := filepath.Glob(repoPath(t, "examples/inputs/*.json"))
	require.NoError(t, err)
	kinds := map[string]bool{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			parts := strings.SplitN(name, "-", 3)
			require.GreaterOrEqual(t, len(parts), 2, "name the file KIND-allowed or KIND-denied[-CODE]")
			kind, verdict := parts[0], parts[1]
			require.Contains(t, []string{"allowed", "denied"}, verdict)

			raw, err := os.ReadFile(f)
			require.NoError(t, err)
			var in struct{ Kind string }
			require.NoError(t, json.Unmarshal(raw, &in))
			assert.Equal(t, kind, strings.TrimPrefix(strings.ReplaceAll(in.Kind, ".", "_"), "mcp_"), "input.kind %q does not match the file name", in.Kind)
			kinds[in.Kind] = true

			code, out, errOut := runCLI(t, nil, "policy", "eval", "--dir", repoPath(t, "policies"), "--input", f)
			require.Equal(t, 0, code, errOut)
			var d struct {
				Allow bool
				Code  string
			}
			require.NoError(t, json.Unmarshal([]byte(out), &d), out)
			assert.Equal(t, verdict == "allowed", d.Allow, out)
			if len(parts) == 3 {
				assert.Contains(t, d.Code, strings.ReplaceAll(parts[2], "-", "_"), out)
			}
		})
	}
	for _, k := range []string{"mcp.tools_list", "mcp.tools_call", "mcp.resources_read", "mcp.prompts_get", "http.connect", "http.request"} {
		assert.True(t, kinds[k], "examples/inputs has no input of kind %s", k)
	}
}
