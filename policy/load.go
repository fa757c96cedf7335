package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/loader"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// Query is the one entry point every decision evaluates.
const Query = "data.sandgate.decision"

// ErrNoPolicy is returned by Load for a folder with no policy file in it.
var ErrNoPolicy = errors.New("no .rego policy files")

// revision is one compiled set of policy files with the decision query compiled against it.
// Decisions run topdown directly on it: rego.PreparedEvalQuery adds per-call work (metrics,
// result conversion) that the hot path does not need.
type revision struct {
	id       string
	compiler *ast.Compiler
	store    storage.Store
	query    ast.Body
	files    []string
	loadedAt time.Time
	cache    *decisionCache // nil: every decision is evaluated
}

// resultVar binds the decision in the compiled query.
var resultVar = ast.Var("__sandgate_decision__")

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

// load compiles the folder into a prepared revision. Errors name the file and line (OPA's
// compile errors do).
func load(ctx context.Context, dir string, cacheEntries int) (*revision, error) {
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("policy folder: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("policy folder %s is not a folder", dir)
	}
	res, err := loader.NewFileLoader().WithRegoVersion(ast.RegoV1).Filtered([]string{dir}, skipFile)
	if err != nil {
		return nil, fmt.Errorf("load policies from %s: %w", dir, err)
	}
	if len(res.Modules) == 0 {
		return nil, fmt.Errorf("%s: %w", dir, ErrNoPolicy)
	}
	modules := make(map[string]*ast.Module, len(res.Modules))
	files := make([]string, 0, len(res.Modules))
	h := sha256.New()
	for name := range res.Modules {
		files = append(files, name)
	}
	sort.Strings(files)
	for _, name := range files {
		m := res.Modules[name]
		modules[name] = m.Parsed
		rel, _ := filepath.Rel(dir, name)
		fmt.Fprintf(h, "module %s %d\n", rel, len(m.Raw))
		h.Write(m.Raw)
	}
	// Data documents are hashed in their canonical JSON form (json.Marshal sorts map keys).
	data, err := json.Marshal(res.Documents)
	if err != nil {
		return nil, fmt.Errorf("policy data in %s: %w", dir, err)
	}
	fmt.Fprintf(h, "data %d\n", len(data))
	h.Write(data)

	compiler := ast.NewCompiler().WithStrict(false)
	compiler.Compile(modules)
	if compiler.Failed() {
		return nil, fmt.Errorf("compile policies in %s: %w", dir, compiler.Errors)
	}
	if !definesDecision(compiler) {
		return nil, fmt.Errorf("policies in %s define no %s rule (write `package sandgate` with a `decision` rule)", dir, Query)
	}
	query, err := compiler.QueryCompiler().Compile(ast.NewBody(ast.Equality.Expr(ast.NewTerm(resultVar), ast.MustParseTerm(Query))))
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", Query, err)
	}
	return &revision{
		id:       hex.EncodeToString(h.Sum(nil))[:16],
		compiler: compiler,
		store:    inmem.NewFromObjectWithOpts(res.Documents, inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true)),
		query:    query,
		files:    files,
		loadedAt: time.Now(),
		cache:    newDecisionCache(compiler, cacheEntries),
	}, nil
}

func definesDecision(c *ast.Compiler) bool {
	ref := ast.MustParseRef(Query)
	return len(c.GetRulesExact(ref)) > 0 || len(c.GetRulesWithPrefix(ref)) > 0
}
