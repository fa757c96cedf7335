// Package docs runs the commands the README and docs/ show. A fenced block whose info string is
// "sh runnable" is run with bash, as pasted, against `make run` (Sandgate serving
// examples/sandgate.yaml on loopback, with the stand-in model API beside it) and nothing else:
// no tool `make setup` installs is there. It must exit 0 and print no "no events match".
// Blocks that need a cluster, Redis or the internet are plain "sh" and are not run.
//
// Everything runs in a copy of the repository in a temporary folder, never in this clone: the
// tour writes var/ (CA, keys, audit log) and bin/, which are the user's. The blocks get the
// PATH of a plain shell: the tools `make setup` installs are reached as the docs say
// (`eval "$(make -s tools-env)"`), not through the PATH the Makefile exports to tests.
package docs

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
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

func TestDocumentedCommandsRun(t *testing.T) {
	tour := startTour(t)
	blocks := runnableBlocks(t, tour.root)
	require.NotEmpty(t, blocks, "README.md marks its tour's blocks runnable")
	for _, b := range blocks {
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", tour.onFreePorts(b.text))
			cmd.Dir = tour.root
			cmd.Env = tour.env()
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s:%d as pasted:\n%s\noutput:\n%s", b.file, b.line, b.text, out)
			// An example that shows nothing after the tour teaches nothing.
			require.NotContains(t, string(out), "no events match", "%s:%d prints an empty result after the tour:\n%s", b.file, b.line, out)
		})
	}
	t.Run("the offline tour", func(t *testing.T) { checkOfflineTour(t, tour) })
	t.Run("make run said what it built and, once, that it was ready", func(t *testing.T) { checkRunOutput(t, tour) })
	t.Run("a second make run names what is in the way", func(t *testing.T) { checkSecondRun(t, tour) })
	t.Run("install.md renders the chart's config and checks it", func(t *testing.T) { checkInstallRender(t, tour) })
	t.Run("Ctrl-C stops make run", func(t *testing.T) { checkCtrlC(t, tour) })
}

// A file the docs name for the reader to use (an example, a policy, the chart, another doc) is
// there: `examples/inputs/tools_call-denied.json` once was not.
func TestDocumentedFilesExist(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	named := regexp.MustCompile("(?:^|[`\\s(])((?:examples|policies|charts|docs)/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\\.[a-z]{1,5})\\b")
	for _, f := range append(files, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range named.FindAllStringSubmatch(line, -1) {
				_, err := os.Stat(filepath.Join(root, m[1]))
				assert.NoError(t, err, "%s:%d names %s", filepath.Base(f), i+1, m[1])
			}
		}
	}
}
