package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServeLetsTheAuditFolderGoWhenItGivesUp: a serve that fails to start after it took the
// audit folder (here: an OTLP variable that does not parse) lets the folder go, so the next serve
// in the same process (a test, an embedding) takes it instead of being told it is taken.
func TestServeLetsTheAuditFolderGoWhenItGivesUp(t *testing.T) {
	dir := t.TempDir()
	admin := freeAddr(t)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen: {admin: %q}\npolicy: {dir: %q}\naudit: {file: {dir: %q}, otlp: {enabled: true}}\nshutdown: {delay: 0s}\n",
		admin, repoPath(t, "policies"), filepath.Join(dir, "audit")))
	var errOut bytes.Buffer
	// The exporter reads the OTEL_* variables from the process environment, as the
	// OpenTelemetry exporters do.
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "not a header list")
	code := run(context.Background(), &cliEnv{stdout: io.Discard, stderr: &errOut, getenv: func(string) string { return "" }},
		[]string{"serve", "--config", cfg})
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut.String(), "OTEL_EXPORTER_OTLP_HEADERS")
	require.NoError(t, os.Unsetenv("OTEL_EXPORTER_OTLP_HEADERS"))

	startServe(t, cfg, func(string) string { return "" })
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + admin + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "the second serve took the folder")
	assert.NotContains(t, errOut.String(), "already taken")
}
