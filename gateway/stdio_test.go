package gateway

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestStdioUpstreamAggregationPrefixesAndConflicts(t *testing.T) {
	bin := buildExampleUpstream(t)
	long := strings.Repeat("x", 60) + "_"
	tests := []struct {
		name  string
		local config.Upstream
		want  []string
	}{
		{"on-conflict prefixes only the clashing names of the later upstream",
			config.Upstream{Name: "local", Command: bin, Prefix: config.PrefixOnConflict},
			[]string{"http_echo", "http_add", "local_echo", "local_add", "get-time", "get-env"}},
		{"always prefixes every name of that upstream",
			config.Upstream{Name: "local", Command: bin, Prefix: config.PrefixAlways},
			[]string{"echo", "add", "local_echo", "local_add", "local_get-time", "local_get-env"}},
		{"never keeps names, and a name both offer is neither's (pins_test.go)",
			config.Upstream{Name: "local", Command: bin, Prefix: config.PrefixNever},
			[]string{"get-time", "get-env"}},
		{"names over 64 characters are shortened with a hash",
			config.Upstream{Name: "local", Command: bin, Args: []string{"-tool-prefix", long}, Prefix: config.PrefixNever},
			[]string{"echo", "add", limitName(long + "echo"), limitName(long + "add"), limitName(long + "get-time"), limitName(long + "get-env")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startHTTPUpstream(t, "127.0.0.1:0")
			httpUp := config.Upstream{Name: "http", URL: up.URL(), Prefix: config.PrefixOnConflict}
			if tt.local.Prefix != config.PrefixOnConflict {
				httpUp.Prefix = config.PrefixNever
			}
			h := startGateway(t, "testdata/policy", httpUp, tt.local)
			h.waitReady(t)
			c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
			names := toolNames(t, c)
			assert.ElementsMatch(t, tt.want, names)
			for _, n := range names {
				assert.LessOrEqual(t, len(n), 64)
			}
			// Every exposed tool reaches its own upstream.
			for _, n := range names {
				if strings.HasSuffix(n, "echo") {
					res, err := callTool(t, c, n, map[string]any{"message": "via " + n})
					require.NoError(t, err)
					assert.Equal(t, "via "+n, resultText(res))
				}
			}
		})
	}
}

func TestStdioUpstreamGetsCredentialInEnvironmentOnly(t *testing.T) {
	bin := buildExampleUpstream(t)
	t.Setenv("SANDGATE_OWN_SECRET", "must-not-leak")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "local", Command: bin,
		Args: []string{"-secret-env", "UPSTREAM_TOKEN"}, CredentialEnv: map[string]string{"UPSTREAM_TOKEN": "upstream"}})
	h.waitReady(t)
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	res, err := callTool(t, c, "get-env", nil)
	require.NoError(t, err)
	assert.Equal(t, "UPSTREAM_TOKEN set: true", resultText(res))
}
