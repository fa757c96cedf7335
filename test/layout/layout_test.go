// Package layout checks the shape of the source tree: the top level shows the architecture,
// and files and functions stay small enough to read.
package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	maxFileLines = 600
	maxFuncLines = 80
)

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return root
}

// The top level holds the two halves, policy and audit, the CLI and what ships with them
// (ARCHITECTURE.md, "Packages"); supporting packages live under internal/.
func TestTopLevelShowsTheArchitecture(t *testing.T) {
	want := map[string]bool{"cmd": true, "gateway": true, "proxy": true, "policy": true, "audit": true,
		"charts": true, "policies": true, "bench": true, "test": true, "internal": true, "docs": true, "examples": true}
	entries, err := os.ReadDir(repoRoot(t))
	require.NoError(t, err)
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		switch e.Name() {
		case "bin", "var", "dist", "node_modules":
			continue // build output and local state, ignored by git
		}
		assert.True(t, want[e.Name()], "top-level folder %s: supporting packages belong under internal/", e.Name())
	}
}

// No Go file outside tests is longer than maxFileLines, and no function longer than
// maxFuncLines: a file is about one thing, a function does one step.
func TestFilesAndFunctionsStaySmall(t *testing.T) {
	root := repoRoot(t)
	var long []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if strings.HasPrefix(rel, "test/kube-apiserver/") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		if n := fset.Position(f.End()).Line; n > maxFileLines {
			long = append(long, rel+": "+strconv.Itoa(n)+" lines")
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n > maxFuncLines {
				long = append(long, rel+": func "+fn.Name.Name+" "+strconv.Itoa(n)+" lines")
			}
		}
		return nil
	})
	require.NoError(t, err)
	sort.Strings(long)
	assert.Empty(t, long, "files over %d lines or functions over %d lines", maxFileLines, maxFuncLines)
}
