package layout

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/sandgate/sandgate/"

// roomRules are the import rules of docs/architecture.md ("Rooms"): for each room (a package
// path prefix; the longest matching prefix applies), the rooms it must not import. Arrows point
// down the request path: the halves call the core, the core calls policy and audit, and nothing
// calls the CLI.
var roomRules = []struct {
	room, why string
	never     []string
}{
	{"cmd/", "the CLI is wiring: nothing imports it", nil},
	{"gateway", "the MCP half never imports the egress half", []string{"proxy", "cmd/", "bench", "test/"}},
	{"proxy", "the egress half never imports the MCP half", []string{"gateway", "cmd/", "bench", "test/"}},
	{"internal/", "supporting packages sit below both halves", []string{"gateway", "proxy", "cmd/", "bench", "test/"}},
	{"policy", "policy decides; it does not know who asks or how the call goes on", []string{"gateway", "proxy", "internal/call", "internal/admission", "cmd/", "bench", "test/"}},
	{"audit", "the event is the bottom of the path", []string{"gateway", "proxy", "policy", "internal/call", "internal/admission", "cmd/", "bench", "test/"}},
	{"bench", "the bench drives the binary; it imports no CLI", []string{"cmd/", "test/"}},
}

// ruleFor is the rule of the longest room that prefixes pkg.
func ruleFor(pkg string) (room string, never []string) {
	best := -1
	for i, r := range roomRules {
		if inRoom(pkg, r.room) && (best < 0 || len(r.room) > len(roomRules[best].room)) {
			best = i
		}
	}
	if best < 0 {
		return "", nil
	}
	return roomRules[best].room, roomRules[best].never
}

// inRoom reports pkg inside room: room "proxy" holds proxy and proxy/hostport, "internal/"
// every package under internal.
func inRoom(pkg, room string) bool {
	if strings.HasSuffix(room, "/") {
		return strings.HasPrefix(pkg, room)
	}
	return pkg == room || strings.HasPrefix(pkg, room+"/")
}

// TestImportsFollowTheRooms reads the imports of every non-test Go file and checks them against
// roomRules: a package never imports a room its room may not, and nothing imports cmd/.
func TestImportsFollowTheRooms(t *testing.T) {
	imports := moduleImports(t)
	require.NotEmpty(t, imports["gateway"], "the import graph was read")
	var bad []string
	for pkg, deps := range imports {
		room, never := ruleFor(pkg)
		for _, dep := range deps {
			if strings.HasPrefix(dep, "cmd/") && !strings.HasPrefix(pkg, "cmd/") {
				bad = append(bad, pkg+" imports "+dep+": nothing imports the CLI")
			}
			for _, n := range never {
				if inRoom(dep, n) && !inRoom(pkg, n) {
					bad = append(bad, pkg+" imports "+dep+" (room "+room+" may not import "+n+")")
				}
			}
		}
	}
	sort.Strings(bad)
	assert.Empty(t, bad, "docs/architecture.md, \"Rooms\", says what each package may import")
}

// TestImportRulesCatchAViolation checks the checker on a made-up graph: a rule that can never
// fire would pass on any tree.
func TestImportRulesCatchAViolation(t *testing.T) {
	for pkg, dep := range map[string]string{"gateway": "proxy", "proxy": "gateway/x", "internal/call": "proxy",
		"policy": "internal/call", "audit": "policy", "internal/limits": "cmd/sandgate"} {
		_, never := ruleFor(pkg)
		caught := false
		for _, n := range never {
			caught = caught || inRoom(dep, n)
		}
		assert.True(t, caught || strings.HasPrefix(dep, "cmd/"), "%s importing %s is refused", pkg, dep)
	}
}

// moduleImports maps each package of the module (by path below the module) to the module
// packages its non-test files import.
func moduleImports(t *testing.T) map[string][]string {
	root := repoRoot(t)
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if dep, ok := strings.CutPrefix(p, module); ok && dep != pkg {
				out[pkg] = append(out[pkg], dep)
			}
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// TestRequestPathDoesNotImportClientGo: what serves a request (both halves, policy, the audit
// log) compiles without the Kubernetes client libraries; only the resolver behind
// identity.Resolver (internal/identity/kubeid) and the CLI's wiring import them. Besides keeping
// the request path's graph small, this keeps `make test-race`, which builds every dependency of
// audit and proxy with the race detector, from compiling client-go and k8s.io/api again
// (issue 39: a third of that build's packages). The resolver's own graph is listed too, so the
// check is seen to find client-go where it is.
func TestRequestPathDoesNotImportClientGo(t *testing.T) {
	deps := func(pkgs ...string) []string {
		cmd := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...)
		cmd.Dir = repoRoot(t)
		out, err := cmd.Output()
		require.NoError(t, err, "go list -deps %v", pkgs)
		var k8s []string
		for _, p := range strings.Fields(string(out)) {
			if strings.HasPrefix(p, "k8s.io/client-go/") || strings.HasPrefix(p, "k8s.io/api/") {
				k8s = append(k8s, p)
			}
		}
		return k8s
	}
	if k8s := deps("./audit", "./policy", "./internal/call", "./proxy", "./gateway"); len(k8s) > 0 {
		t.Errorf("the request path imports %d Kubernetes client packages, %s first (through which package: "+
			"go list -deps -f '{{.ImportPath}}: {{.Imports}}')", len(k8s), k8s[0])
	}
	assert.Contains(t, deps("./internal/identity/kubeid"), "k8s.io/client-go/kubernetes", "the check finds client-go in the resolver")
}
