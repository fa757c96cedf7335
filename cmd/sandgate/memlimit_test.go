package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemoryLimitFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	for _, tc := range []struct {
		name string
		env  map[string]string
		want int64
	}{
		{"no container limit leaves the runtime's default", nil, 0},
		{"a 512 MiB container gets a 90% soft limit", map[string]string{containerMemoryEnv: "536870912"}, 483183819},
		{"GOMEMLIMIT wins (the runtime has applied it)", map[string]string{containerMemoryEnv: "536870912", "GOMEMLIMIT": "400MiB"}, 0},
		{"zero is no limit", map[string]string{containerMemoryEnv: "0"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := memoryLimitFromEnv(env(tc.env))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	for _, bad := range []string{"512Mi", "-1", "1e9"} {
		_, err := memoryLimitFromEnv(env(map[string]string{containerMemoryEnv: bad}))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), containerMemoryEnv, "the error names the variable")
	}
}

// serve sets the runtime's soft limit from the container's memory, and refuses to start on a
// value it cannot read.
func TestServeSetsMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	dir := t.TempDir()
	admin := freeAddr(t)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen:\n  admin: %s\nshutdown:\n  delay: 0s\npolicy:\n  dir: %s\naudit:\n  file:\n    dir: %s\n",
		admin, repoPath(t, "policies"), filepath.Join(dir, "audit")))
	const container = 8 << 30 // large, so the rest of the package's tests run unconstrained
	getenv := func(k string) string {
		if k == containerMemoryEnv {
			return strconv.Itoa(container)
		}
		return ""
	}
	startServe(t, cfg, getenv)
	var metrics string
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		metrics = string(b)
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, metrics, fmt.Sprintf("go_gc_gomemlimit_bytes %g\n", float64(softMemoryLimit(container))))

	var errOut bytes.Buffer
	bad := func(k string) string {
		if k == containerMemoryEnv {
			return "8Gi"
		}
		return ""
	}
	code := run(context.Background(), &cliEnv{stdout: io.Discard, stderr: &errOut, getenv: bad}, []string{"serve", "--config", cfg})
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut.String(), containerMemoryEnv)
}
