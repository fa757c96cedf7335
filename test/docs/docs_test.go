// Package docs runs the commands the README and docs/ show. A fenced block whose info string is
// "sh runnable" is run with bash, as pasted, from the repository root, against Sandgate serving
// examples/sandgate.yaml (what `make run` serves) on loopback; it must exit 0. Blocks that need a
// cluster, Redis or the internet are plain "sh" and are not run.
package docs

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type block struct {
	file string
	line int
	text string
}

// runnableBlocks are the "sh runnable" blocks of README.md and docs/*.md.
func runnableBlocks(t *testing.T, root string) []block {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var out []block
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		sc := bufio.NewScanner(fh)
		var cur *block
		n := 0
		for sc.Scan() {
			n++
			line := sc.Text()
			switch {
			case cur == nil && strings.TrimSpace(line) == "```sh runnable":
				rel, _ := filepath.Rel(root, f)
				cur = &block{file: rel, line: n}
			case cur != nil && strings.TrimSpace(line) == "```":
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				cur.text += line + "\n"
			}
		}
		fh.Close()
		require.NoError(t, sc.Err())
	}
	return out
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func run(t *testing.T, root string, name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v: %s", name, args, out)
}

func TestDocumentedCommandsRun(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	blocks := runnableBlocks(t, root)
	require.NotEmpty(t, blocks, "README.md marks its tour's blocks runnable")

	// What `make run` does first: the binaries, the CA, the audit keys and the example's key.
	run(t, root, "make", "build")
	if _, err := os.Stat(filepath.Join(root, "var", "ca", "ca.crt")); err != nil {
		run(t, root, "./bin/sandgate", "ca", "init", "--dir", "var/ca")
	}
	if _, err := os.Stat(filepath.Join(root, "var", "audit-keys", "chain.key")); err != nil {
		run(t, root, "./bin/sandgate", "audit", "keygen", "--dir", "var/audit-keys")
	}
	require.NoError(t, os.MkdirAll(filepath.Join(root, "var", "secrets"), 0o700))
	if _, err := os.Stat(filepath.Join(root, "var", "secrets", "anthropic")); err != nil {
		require.NoError(t, os.WriteFile(filepath.Join(root, "var", "secrets", "anthropic"), []byte("sk-ant-placeholder-not-a-real-key"), 0o600))
	}

	// examples/sandgate.yaml on free ports (a copy beside it: its paths are relative to its folder).
	ports := map[string]string{"127.0.0.1:8080": freeAddr(t), "127.0.0.1:3128": freeAddr(t), "127.0.0.1:9090": freeAddr(t)}
	cfg, err := os.ReadFile(filepath.Join(root, "examples", "sandgate.yaml"))
	require.NoError(t, err)
	text := string(cfg)
	for from, to := range ports {
		text = strings.ReplaceAll(text, from, to)
	}
	cfgPath := filepath.Join(root, "examples", fmt.Sprintf(".docs-test-%d.yaml", os.Getpid()))
	require.NoError(t, os.WriteFile(cfgPath, []byte(text), 0o600))
	t.Cleanup(func() { os.Remove(cfgPath) })

	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, "./bin/sandgate", "serve", "--config", cfgPath)
	serve.Dir = root
	var log strings.Builder
	serve.Stdout, serve.Stderr = &log, &log
	require.NoError(t, serve.Start())
	t.Cleanup(func() { cancel(); _ = serve.Wait() })
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + ports["127.0.0.1:9090"] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 60*time.Second, 50*time.Millisecond, "sandgate serve did not become ready: %s", &log)

	for _, b := range blocks {
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			script := b.text
			for from, to := range ports {
				script = strings.ReplaceAll(script, from, to)
			}
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s:%d as pasted:\n%s\noutput:\n%s", b.file, b.line, b.text, out)
		})
	}
}
