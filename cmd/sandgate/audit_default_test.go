package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// exampleLogDir matches the example config's audit folder (not the keys' folder).
var exampleLogDir = regexp.MustCompile(`dir: \.\./var/audit(\s)`)

// serveExample serves the example config as `make run` does (its keys made by `audit keygen`),
// on free ports and with a JSON process log (the copy of the checkpoints kept outside the audit
// folder), sends a few requests, calls whileServing with the config's path once their events are
// in the log, stops it, and returns the config's text, the folder of its copy and the process
// log.
func serveExample(t *testing.T, whileServing func(cfg string)) (cfgText, root, processLog string) {
	t.Helper()
	cfg := exampleTree(t)
	root = filepath.Dir(filepath.Dir(cfg))
	b, err := os.ReadFile(cfg)
	require.NoError(t, err)
	cfgText = string(b)
	admin, mcp := freeAddr(t), freeAddr(t)
	for from, to := range map[string]string{"127.0.0.1:8080": mcp, "127.0.0.1:3128": freeAddr(t), "127.0.0.1:9090": admin,
		"format: text": "format: json"} {
		require.Contains(t, cfgText, from)
		cfgText = strings.ReplaceAll(cfgText, from, to)
	}
	cfgText += "shutdown: {delay: 0s}\n" // stop at once: see startServe
	require.NoError(t, os.WriteFile(cfg, []byte(cfgText), 0o600))

	var stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, &cliEnv{stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }}, []string{"serve", "--config", cfg})
	}()
	var code int
	var stopped sync.Once
	stop := func() { stopped.Do(func() { cancel(); code = <-done }) }
	t.Cleanup(stop)
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + admin + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		// The admin listener can be up before the MCP one.
		c, err := net.Dial("tcp", mcp)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "serve: %s", &stderr)
	for i, src := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.9", "127.0.0.9"} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+mcp+"/mcp", strings.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		code, body, _ := send(t, src, req)
		require.Contains(t, []int{http.StatusOK, http.StatusForbidden}, code, "request %d: %s", i, body)
	}
	logDir := filepath.Join(root, "var", "audit")
	require.Eventually(t, func() bool {
		res, err := audit.Query(context.Background(), logDir, audit.Filter{Limit: -1})
		return err == nil && len(res.Events) >= 6
	}, 10*time.Second, 20*time.Millisecond)
	whileServing(cfg)
	stop()
	require.Equal(t, 0, code, "serve stops cleanly: %s", &stderr)
	return cfgText, root, stderr.String()
}

// rechainPlain rewrites lines as someone without the chain key would after an edit: every
// prev_hash and hash recomputed with plain SHA-256 (docs/audit.md, audit/doc.go).
func rechainPlain(lines []string) []string {
	out := make([]string, len(lines))
	prev := ""
	for i, l := range lines {
		j := strings.LastIndex(l, `,"prev_hash":`)
		head := l[:j] + `,"prev_hash":"` + prev + `","hash":"`
		sum := sha256.Sum256([]byte(head + `"}`))
		prev = hex.EncodeToString(sum[:])
		out[i] = head + prev + `"}`
	}
	return out
}

// A log written with the example config's settings (what `make run` serves) is tamper-evident:
// `audit verify --config` with the example's keys exits non-zero for a log that was edited,
// reordered or cut, whether or not the editor recomputed the chain; a cut tail shows against
// the checkpoints of the process log.
func TestDefaultConfigLogIsTamperEvident(t *testing.T) {
	cfgText, root, processLog := serveExample(t, func(cfg string) {
		// The first event was signed at once: the running log verifies with the public key, where
		// before it said "no checkpoint in the log" (exit 4) for a minute or 1000 events.
		code, out, errOut := runCLI(t, nil, "audit", "verify", "--config", cfg)
		assert.Equal(t, 0, code, "the log verifies while serve runs: %s%s", out, errOut)
	})
	plog := filepath.Join(t.TempDir(), "sandgate.log")
	require.NoError(t, os.WriteFile(plog, []byte(processLog), 0o600))
	b, err := os.ReadFile(filepath.Join(root, "var", "audit", audit.ActiveFile))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	var events []int // the indexes of the call events (not the writer's audit.* records)
	for i, l := range lines {
		if !strings.Contains(l, `"kind":"audit.`) {
			events = append(events, i)
		}
	}
	require.GreaterOrEqual(t, len(events), 6)

	n := 0
	verify := func(lines []string, args ...string) (int, string) {
		n++
		dir := fmt.Sprintf("audit-%d", n)
		require.NoError(t, os.MkdirAll(filepath.Join(root, "var", dir), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(root, "var", dir, audit.ActiveFile), []byte(strings.Join(lines, "\n")+"\n"), 0o600))
		cfg := exampleLogDir.ReplaceAllString(cfgText, "dir: ../var/"+dir+"$1")
		require.NotEqual(t, cfgText, cfg)
		path := filepath.Join(root, "examples", dir+".yaml")
		require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
		code, out, errOut := runCLI(t, nil, append([]string{"audit", "verify", "--config", path}, args...)...)
		return code, out + errOut
	}
	code, out := verify(lines)
	require.Equal(t, 0, code, "the log as written verifies: %s", out)
	code, out = verify(lines, "--checkpoint", plog)
	assert.Equal(t, 0, code, "and reaches the process log's checkpoints: %s", out)
	assert.Contains(t, out, "keyed chain")

	edit := func(l string) string { return strings.Replace(l, `"allow":false`, `"allow":true`, 1) }
	swap := func(ls []string, i, j int) []string {
		out := append([]string(nil), ls...)
		out[i], out[j] = out[j], out[i]
		return out
	}
	edited := append([]string(nil), lines...)
	last := events[len(events)-1]
	require.Contains(t, edited[last], `"allow":false`, "the last events are unknown callers, denied")
	edited[last] = edit(edited[last])
	removed := append(append([]string(nil), lines[:events[1]]...), lines[events[1]+1:]...)
	tests := []struct {
		name  string
		lines []string
		args  []string
	}{
		{"an event edited, hashes left as they were", edited, nil},
		{"an event edited, the chain recomputed without the key", rechainPlain(edited), nil},
		{"two events swapped", swap(lines, events[1], events[2]), nil},
		{"two events swapped, the chain recomputed without the key", rechainPlain(swap(lines, events[1], events[2])), nil},
		{"an event removed, the chain recomputed without the key", rechainPlain(removed), nil},
		{"the tail cut, against the process log's checkpoints", lines[:events[3]], []string{"--checkpoint", plog}},
		{"the tail cut and the rest recomputed, against the process log's checkpoints", rechainPlain(lines[:events[3]]), []string{"--checkpoint", plog}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := verify(tt.lines, tt.args...)
			assert.NotEqual(t, 0, code, "audit verify --config exits 0 for a tampered log: %s", out)
			assert.Contains(t, []int{exitBroken, exitUnprotected}, code, out)
		})
	}
	assert.True(t, bytes.Contains([]byte(processLog), []byte(`"msg":"audit checkpoint"`)), "the process log holds the checkpoints")
}
