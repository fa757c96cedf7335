package layout

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// test/setup.sh compiles the race build ahead of make test's test-race step; with other
// compiler flags than the Makefile's its work would be thrown away (the flags are part of the
// build cache's key) and the race build would compile twice on a cold machine.
func TestSetupWarmsTheRaceBuildWithTheMakefilesFlags(t *testing.T) {
	root := repoRoot(t)
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^RACE_GCFLAGS := -gcflags=(.*)$`).FindSubmatch(makefile)
	require.NotNil(t, m, "Makefile: no RACE_GCFLAGS line")
	flags := strings.ReplaceAll(string(m[1]), `\ `, " ")
	require.Contains(t, string(makefile), "go test -race $(RACE_GCFLAGS)", "Makefile: test-race does not use RACE_GCFLAGS")

	setup, err := os.ReadFile(filepath.Join(root, "test", "setup.sh"))
	require.NoError(t, err)
	want := "go build -race -gcflags='" + flags + "' ./audit/ ./proxy/"
	if !strings.Contains(string(setup), want) {
		t.Errorf("test/setup.sh's race warm-up does not build with the Makefile's RACE_GCFLAGS: no %q in it", want)
	}
}
