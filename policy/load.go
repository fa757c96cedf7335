package policy

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// Query is the one entry point every decision evaluates.
const Query = "data.sandgate.decision"

// ErrNoPolicy is returned by Load for a folder with no policy file in it.
var ErrNoPolicy = errors.New("no .rego policy files")

// revision is one compiled set of policy files with the decision query prepared against it:
// every decision is one Eval of OPA's rego API (prepare once, evaluate many). Until issue 38 the
// engine ran topdown below that API, with a stack pool and a data cache of its own, for about a
// third less CPU per first-seen decision; decisions a sandbox repeats are answered by the
// decision cache (cache.go), which the A/B in docs/architecture.md ("Hand-written code on the
// boundary") weighs. OPA's fixes and checks reach this path unchanged.
type revision struct {
	id       string
	compiler *ast.Compiler
	store    storage.Store
	prepared rego.PreparedEvalQuery
	files    []string
	loadedAt time.Time      // set when Reload installs it
	cache    *decisionCache // nil: every decision is evaluated
}

// skipFile leaves out tests, hidden files and folders (editor swap files, a ConfigMap's
// ..data links) and anything that is not policy or data.
func skipFile(abspath string, info fs.FileInfo, depth int) bool {
	name := info.Name()
	if depth > 0 && strings.HasPrefix(name, ".") {
		return true
	}
	if info.IsDir() {
		return false
	}
	if strings.HasSuffix(name, "_test.rego") {
		return true
	}
	switch filepath.Ext(name) {
	case ".rego", ".json", ".yaml", ".yml":
		return false
	}
	return true
}

// maxFolderDepth bounds the folders read below the policy root (a symlink loop would otherwise
// recurse for ever).
const maxFolderDepth = 16

// policyFiles is one reading of a policy folder: every file the engine serves, by its
// slash-separated name relative to the folder, with its contents. A revision is compiled from
// the reading and its id is the reading's hash, so the id names exactly the bytes that were
// compiled, whatever path spelled the folder.
type policyFiles map[string][]byte

// readPolicyFiles reads the files of dir the engine serves (see skipFile), following symlinks
// (a ConfigMap's files are symlinks through ..data).
func readPolicyFiles(dir string) (policyFiles, error) {
	files := policyFiles{}
	err := walkServed(dir, func(rel, abs string, info fs.FileInfo) error {
		if info.IsDir() {
			return nil
		}
		raw, err := os.ReadFile(abs)
		files[rel] = raw
		return err
	})
	if err != nil {
		return nil, err
	}
	return files, nil
}

// walkServed visits the root folder (rel ".") and every folder and file below it that the
// engine serves, following symlinks, the way the OPA loader walks: what is read, hashed and
// watched is the same set.
func walkServed(root string, visit func(rel, abs string, info fs.FileInfo) error) error {
	st, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("policy folder: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("policy folder %s is not a folder", root)
	}
	if err := visit(".", root, st); err != nil {
		return fmt.Errorf("read policies in %s: %w", root, err)
	}
	if err := walkFolder(root, ".", 1, visit); err != nil {
		return fmt.Errorf("read policies in %s: %w", root, err)
	}
	return nil
}

func walkFolder(root, rel string, depth int, visit func(rel, abs string, info fs.FileInfo) error) error {
	if depth > maxFolderDepth {
		return fmt.Errorf("%s: folders nested deeper than %d (a symlink loop?)", rel, maxFolderDepth)
	}
	entries, err := os.ReadDir(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return err
	}
	for _, ent := range entries {
		name := path.Join(rel, ent.Name())
		abs := filepath.Join(root, filepath.FromSlash(name))
		info, err := os.Stat(abs) // follows symlinks, as the OPA loader does
		if err != nil {
			return err
		}
		if skipFile(abs, info, depth) {
			continue
		}
		if err := visit(name, abs, info); err != nil {
			return err
		}
		if info.IsDir() {
			if err := walkFolder(root, name, depth+1, visit); err != nil {
				return err
			}
		}
	}
	return nil
}

// revision is the hash of the files' names and contents, in name order, each length-prefixed
// so that no two different readings encode alike.
func (f policyFiles) revision() string {
	names := make([]string, 0, len(f))
	for name := range f {
		names = append(names, name)
	}
	sort.Strings(names)
	h := sha256.New()
	h.Write([]byte("sandgate policy files v1\n"))
	var n [8]byte
	for _, name := range names {
		binary.BigEndian.PutUint64(n[:], uint64(len(name)))
		h.Write(n[:])
		h.Write([]byte(name))
		binary.BigEndian.PutUint64(n[:], uint64(len(f[name])))
		h.Write(n[:])
		h.Write(f[name])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// compile builds a revision from one reading. The OPA loader reads the reading from memory
// (an fstest.MapFS: a plain read-only map file system), so what is compiled is what is hashed,
// and the loader still decides where data files go under data (by folder) as `opa` does.
func compile(_ context.Context, dir string, files policyFiles, cacheEntries int) (*revision, error) {
	fsys := make(fstest.MapFS, len(files))
	for name, raw := range files {
		fsys[name] = &fstest.MapFile{Data: raw, Mode: 0o444}
	}
	res, err := loader.NewFileLoader().WithFS(fsys).WithRegoVersion(ast.RegoV1).Filtered([]string{"."}, skipFile)
	if err != nil {
		return nil, fmt.Errorf("load policies from %s: %w", dir, err)
	}
	modules := make(map[string]*ast.Module, len(res.Modules))
	for name, m := range res.Modules {
		modules[name] = m.Parsed
	}
	return compileModules(dir, files.revision(), modules, res.Documents, cacheEntries)
}

// compileModules builds a revision named id from parsed modules and data, read from a folder
// or a bundle (dir names the source in errors).
func compileModules(dir, id string, modules map[string]*ast.Module, data map[string]any, cacheEntries int) (*revision, error) {
	if len(modules) == 0 {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoPolicy)
	}
	names := make([]string, 0, len(modules))
	for name := range modules {
		names = append(names, name)
	}
	sort.Strings(names)

	compiler := ast.NewCompiler().WithStrict(false)
	compiler.Compile(modules)
	if compiler.Failed() {
		return nil, fmt.Errorf("compile policies in %s: %w", dir, compiler.Errors)
	}
	if !definesDecision(compiler) {
		return nil, fmt.Errorf("policies in %s define no %s rule (write `package sandgate` with a `decision` rule)", dir, Query)
	}
	store := inmem.NewFromObjectWithOpts(data, inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true))
	prepared, err := rego.New(rego.Query(Query), rego.Compiler(compiler), rego.Store(store),
		rego.StrictBuiltinErrors(true)).PrepareForEval(context.Background())
	if err != nil {
		return nil, fmt.Errorf("prepare %s: %w", Query, err)
	}
	return &revision{
		id:       id,
		compiler: compiler,
		store:    store,
		prepared: prepared,
		files:    names,
		cache:    newDecisionCache(compiler, cacheEntries),
	}, nil
}

func definesDecision(c *ast.Compiler) bool {
	ref := ast.MustParseRef(Query)
	return len(c.GetRulesExact(ref)) > 0 || len(c.GetRulesWithPrefix(ref)) > 0
}
