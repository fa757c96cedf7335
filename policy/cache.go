package policy

import (
	"slices"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The decision cache remembers decisions of one revision by the parts of the input its
// policies read.
//
// A revision's decision is a pure function of the input documents its rules reference: the
// policy files and data are fixed for the revision's lifetime, and a revision that calls a
// builtin whose answer can change between evaluations (time, randomness, the network, print)
// gets no cache at all. So at load the compiled modules are walked for every reference into
// input; each reference contributes its longest constant prefix (input.http.model,
// input.mcp.arguments.owner, or input.http for input.http[x], or all of input for a bare
// `input` or a dynamic first key). The cache key is the canonical text of the values at those
// prefixes (cachekey.go). Two inputs with equal keys agree on everything the policy can see, so
// they get the same decision.
//
// The shipped policies read the template, the kind and a handful of request fields, never the
// sandbox's name or usage, so thousands of sandboxes of a few templates share a small set of
// keys and most decisions are a map lookup. Only decisions the policy made are cached; engine
// denials (evaluation errors, a cancelled context) are not, and a context that is already done
// is denied before the cache is consulted (engine.go, abandoned).
//
// Why it stays, though its correctness rests on Sandgate's own reading of the modules
// (docs/architecture.md, "Hand-written code on the boundary"): in an interleaved A/B, the cache
// on over off, CPU per request was 0.60x on the route, 0.52x on intercept and 0.64x on mcp.
// differential_internal_test.go holds it to OPA's rego API, and fails when the key misses a part
// of input a policy reads.

// DefaultCacheEntries bounds the decisions remembered per revision. When full the cache
// starts over: a sandbox that sends ever-new inputs costs itself evaluations, not memory.
const DefaultCacheEntries = 16384

// maxCacheKeyBytes leaves inputs whose referenced parts are large (a policy reading all
// tool-call arguments, say) uncached rather than holding big keys.
const maxCacheKeyBytes = 2048

// nondeterministic builtins make a revision uncacheable. OPA marks most of them; print and
// trace are listed because skipping them on a hit would silently lose their output.
var nondeterministic = map[string]bool{
	"print": true, "internal.print": true, "trace": true,
	"time.now_ns": true, "opa.runtime": true, "rand.intn": true, "uuid.rfc4122": true,
	"http.send": true, "net.lookup_ip_addr": true,
	"io.jwt.decode_verify": true, "io.jwt.encode_sign": true, "io.jwt.encode_sign_raw": true,
	"crypto.x509.parse_and_verify_certificates":              true,
	"crypto.x509.parse_and_verify_certificates_with_options": true,
}

// inputPath is one referenced part of input: the keys from the root ("" path = all of input).
type inputPath []*ast.Term

// decisionCache is a revision's cache; nil when the revision is not cacheable or caching is off.
type decisionCache struct {
	parts []keyPart // the referenced paths and their renderers (cachekey.go)
	max   int

	mu      sync.RWMutex
	entries map[string]Decision
}

// newDecisionCache analyses the compiled modules. It returns nil (no caching) for max ≤ 0 or
// for policies that call a nondeterministic builtin.
func newDecisionCache(c *ast.Compiler, max int) *decisionCache {
	if max <= 0 {
		return nil
	}
	paths, ok := inputDependencies(c)
	if !ok {
		return nil
	}
	return &decisionCache{parts: keyParts(paths), max: max, entries: make(map[string]Decision)}
}

// inputDependencies lists the input prefixes the modules read, shortest covering set first,
// and reports false if a module calls a nondeterministic builtin.
func inputDependencies(c *ast.Compiler) ([]inputPath, bool) {
	var refs []ast.Ref
	deterministic := true
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		switch x := x.(type) {
		case *ast.Expr:
			if x.IsCall() && isNondeterministic(x.Operator()) {
				deterministic = false
			}
		case ast.Call:
			if isNondeterministic(x.Operator()) {
				deterministic = false
			}
		case ast.Ref:
			if x.HasPrefix(ast.InputRootRef) {
				refs = append(refs, constantPrefix(x))
			}
			// The head is a variable (input, data, a local) or a term walked below; the
			// operands may hold further references (data.x[input.y]).
			for _, t := range x[1:] {
				vis.Walk(t)
			}
			if _, isVar := x[0].Value.(ast.Var); !isVar {
				vis.Walk(x[0])
			}
			return true
		case ast.Var:
			if x.Equal(ast.InputRootDocument.Value) {
				refs = append(refs, ast.InputRootRef)
			}
		}
		return false
	})
	for _, m := range c.Modules {
		vis.Walk(m)
	}
	return coveringPaths(refs), deterministic
}

func isNondeterministic(op ast.Ref) bool {
	name := op.String()
	if nondeterministic[name] {
		return true
	}
	b, ok := ast.BuiltinMap[name]
	return ok && b.Nondeterministic
}

// constantPrefix cuts a reference at its first operand that is not a string constant.
func constantPrefix(r ast.Ref) ast.Ref {
	for i := 1; i < len(r); i++ {
		if _, ok := r[i].Value.(ast.String); !ok {
			return r[:i]
		}
	}
	return r
}

// coveringPaths drops every reference that another one contains (input.http covers
// input.http.model) and returns the rest, without the root, in a fixed order.
func coveringPaths(refs []ast.Ref) []inputPath {
	slices.SortFunc(refs, func(a, b ast.Ref) int { return a.Compare(b) })
	var out []inputPath
	var last ast.Ref
	for _, r := range refs {
		if last != nil && r.HasPrefix(last) {
			continue
		}
		last = r
		out = append(out, inputPath(r[1:]))
	}
	return out
}

// get looks key up without copying it (the map index of a converted []byte does not allocate).
func (c *decisionCache) get(key []byte) (Decision, bool) {
	c.mu.RLock()
	d, ok := c.entries[string(key)]
	c.mu.RUnlock()
	return d, ok
}

func (c *decisionCache) put(key string, d Decision) {
	c.mu.Lock()
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[key] = d
	c.mu.Unlock()
}

// cacheable reports whether a decision is the policy's answer (defined or undefined) rather
// than an engine denial that another try might not repeat.
func cacheable(d Decision) bool { return d.Err == nil }
