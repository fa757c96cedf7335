package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
)

// eventRooms are where the halves and their helpers live: none of their non-test files may
// write a call's audit event except internal/call (docs/architecture.md, "One path").
var eventRooms = []string{"gateway", "proxy", "cmd", "internal"}

// Only internal/call writes a call's audit event: the halves note what they learned through
// its methods (Describe, Answered, Note …). The field is unexported, so the compiler enforces
// it today; this scan keeps it so if someone exports it again. It flags, outside internal/call,
// an assignment or ++/-- to anything reached through a selector named Event, and taking the
// address of one (a pointer into the event is a write handle).
func TestEventFieldsSetOnlyInCall(t *testing.T) {
	var bad []string
	halvesFiles(t, func(rel string, fset *token.FileSet, f *ast.File) {
		bad = append(bad, eventWrites(fset, f, rel)...)
	})
	assert.Empty(t, bad, "audit event fields written outside internal/call: note them through call.Call's methods instead")
}

// halvesFiles parses each non-test Go file of the eventRooms outside internal/call and hands it
// to check with its path from the repository's root.
func halvesFiles(t *testing.T, check func(rel string, fset *token.FileSet, f *ast.File)) {
	root := repoRoot(t)
	for _, room := range eventRooms {
		err := filepath.WalkDir(filepath.Join(root, room), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if d.IsDir() && rel == "internal/call" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			require.NoError(t, err, "parsing %s", rel)
			check(rel, fset, f)
			return nil
		})
		require.NoError(t, err, "walking %s", room)
	}
}

// eventWrites lists the places in the file f (at rel) that write through a selector named Event.
func eventWrites(fset *token.FileSet, f *ast.File, rel string) []string {
	var out []string
	flag := func(e ast.Expr, what string) {
		if reachesEvent(e) {
			out = append(out, rel+":"+strconv.Itoa(fset.Position(e.Pos()).Line)+": "+what)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok != token.DEFINE {
				for _, l := range n.Lhs {
					flag(l, "assignment")
				}
			}
		case *ast.IncDecStmt:
			flag(n.X, n.Tok.String())
		case *ast.UnaryExpr:
			if n.Op == token.AND {
				flag(n.X, "address taken")
			}
		}
		return true
	})
	return out
}

// reachesEvent reports whether e is, or is part of, something selected by the name Event.
func reachesEvent(e ast.Expr) bool {
	for {
		switch x := e.(type) {
		case *ast.SelectorExpr:
			if x.Sel.Name == "Event" {
				return true
			}
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.StarExpr:
			e = x.X
		default:
			return false
		}
	}
}

// The scan above is syntactic; this closes the other doors: call.Call exports no field that
// holds any part of an audit event, and no method that hands out a pointer into one.
func TestCallHandsOutNoEventPointer(t *testing.T) {
	ct := reflect.TypeOf(call.Call{})
	for i := range ct.NumField() {
		f := ct.Field(i)
		if f.IsExported() {
			assert.False(t, isAudit(f.Type), "call.Call.%s exposes the audit event", f.Name)
		}
	}
	pt := reflect.PointerTo(ct)
	for i := range pt.NumMethod() {
		m := pt.Method(i)
		for j := range m.Type.NumOut() {
			o := m.Type.Out(j)
			assert.False(t, o.Kind() == reflect.Pointer && isAudit(o.Elem()),
				"(*call.Call).%s returns a pointer into the audit event", m.Name)
		}
	}
}

// isAudit reports whether t is one of package audit's structs (the event or a part of it).
func isAudit(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t.PkgPath() == reflect.TypeOf(audit.Event{}).PkgPath()
}

// stepMethods are internal/call's steps of a call's sequence: begin, the audit log's room, the
// decision, the credential, and the ends. They are unexported, so nothing outside internal/call
// can call them (the compiler keeps it so); inside it, they are called from call.Run's sequence
// only (run.go's Run, decide and end), and from one another (an end finishes).
var stepMethods = map[string]bool{"begin": true, "auditRefusal": true, "authorize": true, "takeCredential": true,
	"refuse": true, "hide": true, "fail": true, "finish": true, "decide": true, "end": true}

// stepCallers are the functions that may call a step: Run's sequence, and the steps.
var stepCallers = map[string]bool{"Run": true, "decide": true, "end": true, "authorize": true, "refuse": true, "hide": true, "fail": true}

// stepCallsOutsideRun lists the calls of a step method in f from outside Run's sequence, as
// "file:line in function".
func stepCallsOutsideRun(fset *token.FileSet, f *ast.File) []string {
	var bad []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil || stepCallers[fn.Name.Name] {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if s, ok := c.Fun.(*ast.SelectorExpr); ok && stepMethods[s.Sel.Name] {
					pos := fset.Position(c.Pos())
					bad = append(bad, filepath.Base(pos.Filename)+":"+strconv.Itoa(pos.Line)+" in "+fn.Name.Name)
				}
			}
			return true
		})
	}
	return bad
}

// A refusal ends a call the same way on both halves because one sequence ends every call: the
// step methods of internal/call are called from call.Run only (see stepMethods).
func TestStepMethodsAreCalledFromRunOnly(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "internal", "call")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	fset := token.NewFileSet()
	var bad []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		require.NoError(t, err)
		bad = append(bad, stepCallsOutsideRun(fset, f)...)
	}
	assert.Empty(t, bad, "steps of a call taken outside call.Run: give Run's sequence a hook instead")
}

// The checker above catches what it is for: a step planted in another function is flagged,
// one inside Run's sequence is not.
func TestStepCheckCatchesAViolation(t *testing.T) {
	const src = `package call
func Run() { cl.finish(); cl.decide(nil, nil) }
func (cl *Call) end(e End) { cl.finish() }
func (c *Core) sneak(cl *Call) { cl.refuse(nil); cl.Describe(t) }
func (c *Core) Reject() { _ = func() { cl.authorize(ctx, in, true) } }
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "planted.go", src, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"planted.go:4 in sneak", "planted.go:5 in Reject"}, stepCallsOutsideRun(fset, f))
}
