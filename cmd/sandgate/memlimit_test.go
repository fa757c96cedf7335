package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/gcfloor"
)

func TestMemoryLimitFromEnv(t *testing.T) {
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
			got, err := memoryLimitFromEnv(envOf(tc.env))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	for _, bad := range []string{"512Mi", "-1", "1e9"} {
		_, err := memoryLimitFromEnv(envOf(map[string]string{containerMemoryEnv: bad}))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), containerMemoryEnv, "the error names the variable")
	}
}

// serve sets the runtime's soft limit from the container's memory, and refuses to start on a
// value it cannot read.
func TestServeSetsMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	cfg, admin := adminOnlyConfig(t)
	const container = 8 << 30 // large, so the rest of the package's tests run unconstrained
	startServe(t, cfg, envWith(containerMemoryEnv, strconv.Itoa(container)))
	var metrics string
	require.Eventually(t, func() bool {
		var ok bool
		metrics, ok = adminMetrics(admin)
		return ok
	}, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, metrics, fmt.Sprintf("go_gc_gomemlimit_bytes %g\n", float64(softMemoryLimit(container))))

	assertServeRefuses(t, cfg, containerMemoryEnv, "8Gi")
}

// adminOnlyConfig writes a config that serves the admin listener (on a free port, returned) with
// the shipped policies and stops at once.
func adminOnlyConfig(t *testing.T) (cfg, admin string) {
	dir := t.TempDir()
	admin = freeAddr(t)
	cfg = writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen:\n  admin: %s\nshutdown:\n  delay: 0s\npolicy:\n  dir: %s\naudit:\n  file:\n    dir: %s\n",
		admin, repoPath(t, "policies"), filepath.Join(dir, "audit")))
	return cfg, admin
}

// envOf is an environment holding the variables of kv.
func envOf(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

// envWith is an environment holding one variable.
func envWith(key, value string) func(string) string { return envOf(map[string]string{key: value}) }

// adminMetrics is the admin listener's /metrics page, ok when it answered 200.
func adminMetrics(admin string) (string, bool) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode == http.StatusOK
}

// assertServeRefuses checks that serve does not start with key=value and names key.
func assertServeRefuses(t *testing.T, cfg, key, value string) {
	t.Helper()
	var errOut bytes.Buffer
	code := run(context.Background(), &cliEnv{stdout: io.Discard, stderr: &errOut, getenv: envWith(key, value)}, []string{"serve", "--config", cfg})
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut.String(), key)
}

func TestHeapFloorFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       map[string]string
		softLimit int64
		want      uint64
	}{
		{"the default floor", nil, 0, gcfloor.DefaultFloor},
		{"GOGC set: no floor (its setter chose the pace)", map[string]string{"GOGC": "200"}, 0, 0},
		{"a floor of its own", map[string]string{heapFloorEnv: "33554432"}, 0, 32 << 20},
		{"zero turns it off", map[string]string{heapFloorEnv: "0"}, 0, 0},
		{"at most a quarter of the soft limit", nil, 128 << 20, 32 << 20},
		{"under a roomy limit the default", nil, 1 << 30, gcfloor.DefaultFloor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := heapFloorFromEnv(envOf(tc.env), tc.softLimit)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	for _, bad := range []string{"64Mi", "-1", "1e9"} {
		_, err := heapFloorFromEnv(envOf(map[string]string{heapFloorEnv: bad}), 0)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), heapFloorEnv, "the error names the variable")
	}
}

// serve keeps a heap floor: after a collection of this test's small heap, Go's GOGC (as
// /metrics reports it) is above the runtime's 100. A value serve cannot read stops it.
func TestServeKeepsAHeapFloor(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	cfg, admin := adminOnlyConfig(t)
	startServe(t, cfg, envWith(heapFloorEnv, strconv.Itoa(1<<30))) // far above this test process's live heap
	var gogc string
	floorSet := assert.Eventually(t, func() bool {
		runtime.GC() // the floor is set after a collection
		metrics, _ := adminMetrics(admin)
		for _, l := range strings.Split(metrics, "\n") {
			if v, ok := strings.CutPrefix(l, "go_gc_gogc_percent "); ok {
				gogc = v
				n, err := strconv.ParseFloat(v, 64)
				return err == nil && n > 100
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	if !floorSet {
		t.Fatalf("GOGC at the last look: %q", gogc)
	}

	assertServeRefuses(t, cfg, heapFloorEnv, "64Mi")
}
