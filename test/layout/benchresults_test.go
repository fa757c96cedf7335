package layout

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxBenchShare is the most of the repository's tracked lines bench/results may hold: it keeps
// the newest report and one per landed change that moved a ratio, not every run's raw dump
// (bench/results/README.md; issue 38).
const maxBenchShare = 0.10

// The repository is not its lab notebook: the tracked lines under bench/results stay within
// maxBenchShare of all tracked lines.
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
	var all, bench int
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		}
		require.NoError(t, err, "reading the tracked file %s", rel)
		n := bytes.Count(b, []byte("\n"))
		all += n
		if strings.HasPrefix(rel, "bench/results/") {
			bench += n
		}
	}
	require.Positive(t, all)
	share := float64(bench) / float64(all)
	t.Logf("bench/results: %d of %d tracked lines (%.1f%%)", bench, all, 100*share)
	require.LessOrEqual(t, share, maxBenchShare,
		"bench/results holds %d of %d tracked lines: keep the newest report and one per landed change that moved a ratio (bench/results/README.md)", bench, all)
}
