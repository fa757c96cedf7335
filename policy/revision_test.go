package policy_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/policy"
)

// The revision is a hash of the served files' names relative to the policy root and their
// contents: the same folder gives the same revision however its path is spelled, so
// `sandgate policy eval` prints the policy_revision the server writes into audit events.
func TestRevisionDependsOnlyOnNamesAndContents(t *testing.T) {
	files := map[string]string{
		"p.rego":         allowEcho,
		"p_test.rego":    "package sandgate_test\n\ntest_x if true\n",
		"data.yaml":      "limits:\n  x: 1\n",
		"sub/extra.rego": "package sandgate.extra\n\nx := 1\n",
		"sub/more.json":  `{"y": 2}`,
	}
	write := func(t *testing.T, root string, files map[string]string) {
		t.Helper()
		for name, src := range files {
			p := filepath.Join(root, filepath.FromSlash(name))
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
		}
	}
	revisionOf := func(t *testing.T, dir string) string {
		t.Helper()
		e, err := policy.New(context.Background(), dir)
		require.NoError(t, err)
		return e.Revision()
	}
	with := func(change func(map[string]string)) map[string]string {
		m := map[string]string{}
		for k, v := range files {
			m[k] = v
		}
		change(m)
		return m
	}

	base := t.TempDir()
	a := filepath.Join(base, "a", "policies")
	write(t, a, files)
	want := revisionOf(t, a)

	t.Run("same files in another folder", func(t *testing.T) {
		b := filepath.Join(t.TempDir(), "elsewhere")
		write(t, b, files)
		assert.Equal(t, want, revisionOf(t, b))
	})
	t.Run("same folder through a symlink", func(t *testing.T) {
		link := filepath.Join(t.TempDir(), "link")
		require.NoError(t, os.Symlink(a, link))
		assert.Equal(t, want, revisionOf(t, link))
	})
	t.Run("same folder by a relative path and with dots", func(t *testing.T) {
		t.Chdir(filepath.Join(base, "a"))
		assert.Equal(t, want, revisionOf(t, "policies"))
		assert.Equal(t, want, revisionOf(t, "./policies/"))
		assert.Equal(t, want, revisionOf(t, "../a/policies"))
	})
	t.Run("a ConfigMap-style folder of symlinks through ..data", func(t *testing.T) {
		root := t.TempDir()
		write(t, filepath.Join(root, "..2026_11_30_12_00_00.000000001"), files)
		require.NoError(t, os.Symlink("..2026_11_30_12_00_00.000000001", filepath.Join(root, "..data")))
		for _, top := range []string{"p.rego", "p_test.rego", "data.yaml", "sub"} {
			require.NoError(t, os.Symlink(filepath.Join("..data", top), filepath.Join(root, top)))
		}
		assert.Equal(t, want, revisionOf(t, root))
	})

	changes := []struct {
		name   string
		change func(map[string]string)
	}{
		{"a policy's content changes", func(m map[string]string) { m["p.rego"] += "\n# note\n" }},
		{"a data file's content changes", func(m map[string]string) { m["sub/more.json"] = `{"y": 3}` }},
		{"a policy is renamed", func(m map[string]string) { m["q.rego"] = m["p.rego"]; delete(m, "p.rego") }},
		{"a data file moves to another folder", func(m map[string]string) { m["other/more.json"] = m["sub/more.json"]; delete(m, "sub/more.json") }},
	}
	for _, tc := range changes {
		t.Run(tc.name+" gives another revision", func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, with(tc.change))
			assert.NotEqual(t, want, revisionOf(t, dir))
		})
	}
	t.Run("a test file or a hidden file does not change it", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, with(func(m map[string]string) {
			m["p_test.rego"] = "package sandgate_test\n\ntest_y if true\n"
			m[".p.rego.swp"] = "junk"
		}))
		assert.Equal(t, want, revisionOf(t, dir))
	})
}
