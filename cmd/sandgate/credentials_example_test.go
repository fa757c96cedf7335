package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// The minted credential examples/sandgate.yaml carries commented out (make run starts no IdP)
// is a valid config once uncommented, as docs/credentials.md tells the reader to.
func TestTheExamplesMintedCredentialIsValidUncommented(t *testing.T) {
	path := repoPath(t, "examples/sandgate.yaml")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	block := regexp.MustCompile(`(?s)\n( *)# minted-credentials:begin\n(.*?)\n *# minted-credentials:end`).FindSubmatch(b)
	require.NotNil(t, block, "the block's markers")
	indent := string(block[1])
	var lines []string
	for _, l := range strings.Split(string(block[2]), "\n") {
		lines = append(lines, indent+strings.TrimPrefix(strings.TrimPrefix(l, indent), "# "))
	}
	doc := strings.Replace(string(b), string(block[2]), strings.Join(lines, "\n"), 1)
	cfg, err := config.Parse([]byte(doc), repoPath(t, "examples"))
	require.NoError(t, err)
	var minted []string
	for _, c := range cfg.Credentials {
		if c.Minted() {
			minted = append(minted, c.Name)
		}
	}
	assert.Equal(t, []string{"inventory"}, minted)
}
