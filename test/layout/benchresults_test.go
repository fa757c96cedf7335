package layout

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The repository is not its lab notebook: bench/results keeps the latest full report and one
// per release tag (bench/results/README.md; issues 38 and 60), and git history keeps the rest.
// Its tracked files are counted by number, bytes and lines: a gate on lines alone let 145
// files, a quarter of the repository's bytes, through (charts and JSON have few lines).
const (
	maxBenchFiles = 10
	maxBenchShare = 0.10 // of the tracked bytes, and of the tracked lines
)

func TestBenchResultsStayASmallShare(t *testing.T) {
	root := repoRoot(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: the tracked files cannot be listed")
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("not a git checkout (git ls-files: %v)", err)
	}
	var all, bench struct{ files, bytes, lines int }
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		}
		require.NoError(t, err, "reading the tracked file %s", rel)
		n := bytes.Count(b, []byte("\n"))
		all.files, all.bytes, all.lines = all.files+1, all.bytes+len(b), all.lines+n
		if strings.HasPrefix(rel, "bench/results/") {
			bench.files, bench.bytes, bench.lines = bench.files+1, bench.bytes+len(b), bench.lines+n
		}
	}
	require.Positive(t, all.lines)
	t.Logf("bench/results: %d of %d tracked files, %d of %d bytes (%.1f%%), %d of %d lines (%.1f%%)", bench.files, all.files,
		bench.bytes, all.bytes, 100*float64(bench.bytes)/float64(all.bytes), bench.lines, all.lines, 100*float64(bench.lines)/float64(all.lines))
	const keep = "keep the latest full report and one per release tag; git history keeps the rest (bench/results/HISTORY.md)"
	assert.LessOrEqual(t, bench.files, maxBenchFiles, "bench/results holds %d tracked files: %s", bench.files, keep)
	assert.LessOrEqual(t, float64(bench.bytes)/float64(all.bytes), maxBenchShare, "bench/results holds %d of %d tracked bytes: %s", bench.bytes, all.bytes, keep)
	assert.LessOrEqual(t, float64(bench.lines)/float64(all.lines), maxBenchShare, "bench/results holds %d of %d tracked lines: %s", bench.lines, all.lines, keep)
}
