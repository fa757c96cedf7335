package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/test/otelcoltest"
)

// TestDocsCollectorConfig has a real Collector (test/otelcol, built with the components the
// example uses) validate each "yaml otelcol" block of docs/*.md: the fan-out example in
// docs/audit.md must be a configuration a Collector accepts.
func TestDocsCollectorConfig(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		for i, b := range fencedBlocks(t, f, "yaml otelcol") {
			n++
			path := filepath.Join(t.TempDir(), "otelcol.yaml")
			require.NoError(t, os.WriteFile(path, []byte(b), 0o600))
			require.NoError(t, otelcoltest.Validate(t, path, "SIEM_TOKEN=token-for-validation"), "%s, block %d", filepath.Base(f), i+1)
		}
	}
	require.Positive(t, n, "docs/audit.md shows a Collector configuration")
}

// fencedBlocks returns the bodies of the blocks of file whose info string is info.
func fencedBlocks(t *testing.T, file, info string) []string {
	t.Helper()
	fh, err := os.Open(file)
	require.NoError(t, err)
	defer fh.Close()
	var out []string
	var cur *strings.Builder
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```"+info:
			cur = &strings.Builder{}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	require.NoError(t, sc.Err())
	return out
}
