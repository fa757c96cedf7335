package policy

import (
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// Input is the policy input contract (ARCHITECTURE.md, "Policy contract"). The one place that
// turns a call into what policy sees; gateway and proxy fill it, Engine.Decide evaluates it.
type Input struct {
	Kind     audit.Kind // one of the kinds policy decides (audit.KindToolsCall …)
	Identity identity.Identity
	MCP      *MCP  // for mcp.* kinds
	HTTP     *HTTP // for http.* kinds
	// Grants are the caller's grants registered through the admin API, by name.
	Grants map[string]any
	// Usage is the caller's current consumption (requests per minute, tokens today …), by name.
	Usage map[string]int64
	// Credential is input.credential: set only when the destination injects a credential
	// minted per run, with what a token of the run may reach (nil: absent from the input).
	Credential *Credential
}

// Credential is input.credential: the minted credential the call's destination injects and
// the scope a token of the caller's run has (docs/credentials.md). A rule can refuse a call
// whose target lies outside what the run's token could reach.
type Credential struct {
	Name     string
	Provider string // oauth2_client_credentials, token_exchange or github_app
	// Audience and Scopes are what an OAuth token is requested for.
	Audience []string
	Scopes   []string
	// Repositories ("owner/repo") and Permissions (contents: read …) are a GitHub App
	// installation token's.
	Repositories []string
	Permissions  map[string]string
}

// document is the credential as decoded JSON, for the decision log and the AST.
func (c *Credential) document() map[string]any {
	perms := make(map[string]any, len(c.Permissions))
	for k, v := range c.Permissions {
		perms[k] = v
	}
	return map[string]any{"name": c.Name, "provider": c.Provider, "audience": anyStrings(c.Audience),
		"scopes": anyStrings(c.Scopes), "repositories": anyStrings(c.Repositories), "permissions": perms}
}

func anyStrings(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// MCP is input.mcp: the upstream server, the tool (or resource URI, prompt name), the call's
// arguments as decoded JSON, and whether the target exists and the caller can see it.
//
// Every tools/call, prompts/get and resources/read is decided, also of a target the caller's
// list does not show or that no upstream offers: policy sees input.mcp.visible and
// input.mcp.exists, the decision is on record (audit event, decision log, shadow, replay), and
// the sandbox's answer for a hidden target is the one for a missing target, byte for byte
// (docs/policies.md, "Hidden and missing targets"). The zero value is a target that exists and
// is visible.
type MCP struct {
	Upstream  string
	Tool      string
	Arguments map[string]any
	// NotFound says no upstream offers the target: input.mcp.exists is false, Upstream is
	// empty and Tool is the name (or URI) as the sandbox sent it.
	NotFound bool
	// Hidden says the caller's list does not show the target (policy's list decision, or a
	// client capability the sandbox did not declare): input.mcp.visible is false.
	Hidden bool
}

// HTTP is input.http. Model, MaxTokens and Stream are read from a model-API request body;
// MaxTokens is -1 when the body does not say.
type HTTP struct {
	Method    string
	Host      string
	Port      int
	Path      string
	Route     string
	Model     string
	MaxTokens int64
	Stream    bool
}

var (
	kKind      = ast.StringTerm("kind")
	kIdentity  = ast.StringTerm("identity")
	kMCP       = ast.StringTerm("mcp")
	kHTTP      = ast.StringTerm("http")
	kGrants    = ast.StringTerm("grants")
	kUsage     = ast.StringTerm("usage")
	kCred      = ast.StringTerm("credential")
	kNamespace = ast.StringTerm("namespace")
	kSandbox   = ast.StringTerm("sandbox")
	kTemplate  = ast.StringTerm("template")
	kClaim     = ast.StringTerm("claim")
	kLabels    = ast.StringTerm("labels")
	kSourceIP  = ast.StringTerm("source_ip")
	kKnown     = ast.StringTerm("known")
	kUpstream  = ast.StringTerm("upstream")
	kTool      = ast.StringTerm("tool")
	kArguments = ast.StringTerm("arguments")
	kExists    = ast.StringTerm("exists")
	kVisible   = ast.StringTerm("visible")
	kMethod    = ast.StringTerm("method")
	kHost      = ast.StringTerm("host")
	kPort      = ast.StringTerm("port")
	kPath      = ast.StringTerm("path")
	kRoute     = ast.StringTerm("route")
	kModel     = ast.StringTerm("model")
	kMaxTokens = ast.StringTerm("max_tokens")
	kStream    = ast.StringTerm("stream")
)

// Value builds input as an AST value. Absent sections are present as empty objects, so policies
// can write input.grants.x without guarding against undefined parents. It fails only for
// arguments or grants that are not JSON values; the caller then denies.
func (in *Input) Value() (ast.Value, error) {
	obj := ast.NewObject()
	for _, k := range sectionKeys {
		t, err := in.section(k)
		if err != nil {
			return nil, err
		}
		if t != nil {
			obj.Insert(k, t)
		}
	}
	return obj, nil
}

// The document's layout, shared by Value (the whole input) and field (one part of it, for the
// decision cache): one list of keys per object and one function giving each key's value.
var (
	sectionKeys  = []*ast.Term{kKind, kIdentity, kGrants, kUsage, kMCP, kHTTP, kCred}
	identityKeys = []*ast.Term{kNamespace, kSandbox, kTemplate, kClaim, kLabels, kSourceIP, kKnown}
	mcpKeys      = []*ast.Term{kUpstream, kTool, kArguments, kExists, kVisible}
	httpKeys     = []*ast.Term{kMethod, kHost, kPort, kPath, kRoute, kModel, kMaxTokens, kStream}
)

// section is input[k]; nil when the section is absent (mcp for http.* kinds and the reverse).
func (in *Input) section(k *ast.Term) (*ast.Term, error) {
	switch k {
	case kKind:
		return ast.StringTerm(string(in.Kind)), nil
	case kIdentity:
		return objectOf(identityKeys, func(k *ast.Term) (*ast.Term, error) { return identityField(&in.Identity, k), nil })
	case kGrants:
		t, err := anyTerm(in.Grants)
		if err != nil {
			return nil, fmt.Errorf("input.grants: %w", err)
		}
		return t, nil
	case kUsage:
		usage := ast.NewObject()
		for k, v := range in.Usage {
			usage.Insert(ast.StringTerm(k), ast.IntNumberTerm(int(v)))
		}
		return ast.NewTerm(usage), nil
	case kMCP:
		if in.MCP == nil {
			return nil, nil
		}
		return objectOf(mcpKeys, func(k *ast.Term) (*ast.Term, error) { return mcpField(in.MCP, k) })
	case kHTTP:
		if in.HTTP == nil {
			return nil, nil
		}
		return objectOf(httpKeys, func(k *ast.Term) (*ast.Term, error) { return httpField(in.HTTP, k), nil })
	case kCred:
		if in.Credential == nil {
			return nil, nil
		}
		return anyTerm(in.Credential.document())
	}
	return nil, nil
}

func objectOf(keys []*ast.Term, value func(*ast.Term) (*ast.Term, error)) (*ast.Term, error) {
	items := make([][2]*ast.Term, len(keys))
	for i, k := range keys {
		v, err := value(k)
		if err != nil {
			return nil, err
		}
		items[i] = ast.Item(k, v)
	}
	return ast.ObjectTerm(items...), nil
}

func identityField(id *identity.Identity, k *ast.Term) *ast.Term {
	switch k {
	case kNamespace:
		return ast.StringTerm(id.Namespace)
	case kSandbox:
		return ast.StringTerm(id.Sandbox)
	case kTemplate:
		return ast.StringTerm(id.Template)
	case kClaim:
		return ast.StringTerm(id.Claim)
	case kLabels:
		labels := ast.NewObject()
		for k, v := range id.Labels {
			labels.Insert(ast.StringTerm(k), ast.StringTerm(v))
		}
		return ast.NewTerm(labels)
	case kSourceIP:
		return ast.StringTerm(id.SourceIP)
	case kKnown:
		return ast.BooleanTerm(id.Known)
	}
	return nil
}

func mcpField(m *MCP, k *ast.Term) (*ast.Term, error) {
	switch k {
	case kUpstream:
		return ast.StringTerm(m.Upstream), nil
	case kTool:
		return ast.StringTerm(m.Tool), nil
	case kArguments:
		t, err := anyTerm(m.Arguments)
		if err != nil {
			return nil, fmt.Errorf("input.mcp.arguments: %w", err)
		}
		return t, nil
	case kExists:
		return ast.BooleanTerm(!m.NotFound), nil
	case kVisible:
		return ast.BooleanTerm(!m.Hidden), nil
	}
	return nil, nil
}

func httpField(h *HTTP, k *ast.Term) *ast.Term {
	switch k {
	case kMethod:
		return ast.StringTerm(h.Method)
	case kHost:
		return ast.StringTerm(h.Host)
	case kPort:
		return ast.IntNumberTerm(h.Port)
	case kPath:
		return ast.StringTerm(h.Path)
	case kRoute:
		return ast.StringTerm(h.Route)
	case kModel:
		return ast.StringTerm(h.Model)
	case kMaxTokens:
		return ast.IntNumberTerm(int(h.MaxTokens))
	case kStream:
		return ast.BooleanTerm(h.Stream)
	}
	return nil
}

// field is the value Value() places at path (keys from the root of input), built without the
// rest of the document; nil when the path is undefined. Keys are matched by their string
// value. Decoded JSON (arguments, grants) is walked as Go maps and only the part at the end of
// the path is converted; labels and usage are small and converted whole. An error is the
// one Value() would return for the same part.
func (in *Input) field(path []*ast.Term) (ast.Value, error) {
	if len(path) == 0 {
		return in.Value()
	}
	sec := matchKey(sectionKeys, path[0])
	if sec == nil {
		return nil, nil
	}
	rest := path[1:]
	var t *ast.Term
	var err error
	switch {
	case len(rest) == 0:
		t, err = in.section(sec)
	case sec == kIdentity:
		if k := matchKey(identityKeys, rest[0]); k != nil {
			t, rest = identityField(&in.Identity, k), rest[1:]
		} else {
			return nil, nil
		}
	case sec == kMCP && in.MCP != nil:
		k := matchKey(mcpKeys, rest[0])
		switch {
		case k == nil:
			return nil, nil
		case k == kArguments && len(rest) > 1:
			return jsonField(in.MCP.Arguments, rest[1:], "input.mcp.arguments")
		}
		t, err = mcpField(in.MCP, k)
		rest = rest[1:]
	case sec == kHTTP && in.HTTP != nil:
		if k := matchKey(httpKeys, rest[0]); k != nil {
			t, rest = httpField(in.HTTP, k), rest[1:]
		} else {
			return nil, nil
		}
	case sec == kGrants:
		return jsonField(in.Grants, rest, "input.grants")
	default:
		t, err = in.section(sec)
	}
	if err != nil || t == nil {
		return nil, err
	}
	return lookupValue(t.Value, rest), nil
}

// matchKey is the term of keys (all strings) equal to k.
func matchKey(keys []*ast.Term, k *ast.Term) *ast.Term {
	s, ok := k.Value.(ast.String)
	if !ok {
		return nil
	}
	for _, c := range keys {
		if c.Value.(ast.String) == s {
			return c
		}
	}
	return nil
}

// jsonField walks decoded JSON objects along path and converts only what it finds there, the
// way Value() converts the whole map. Arguments and grants are decoded JSON, so conversion does
// not fail in practice; if it did, only the part on the path is reported.
func jsonField(m map[string]any, path []*ast.Term, what string) (ast.Value, error) {
	var v any = m
	for i, k := range path {
		obj, isObj := v.(map[string]any)
		key, isStr := k.Value.(ast.String)
		if !isObj || !isStr {
			// Not a JSON object, or a key that is not a string: convert here and let the
			// AST resolve the rest (undefined for arrays and scalars under a string key).
			val, err := ast.InterfaceToValue(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			return lookupValue(val, path[i:]), nil
		}
		var found bool
		if v, found = obj[string(key)]; !found {
			return nil, nil
		}
	}
	val, err := ast.InterfaceToValue(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return val, nil
}

// lookupValue follows string keys through objects; nil when the path is undefined.
func lookupValue(v ast.Value, path []*ast.Term) ast.Value {
	for _, k := range path {
		obj, ok := v.(ast.Object)
		if !ok {
			return nil
		}
		t := obj.Get(k)
		if t == nil {
			return nil
		}
		v = t.Value
	}
	return v
}

// anyTerm converts decoded JSON (maps, slices, strings, numbers, bools, nil) to a term.
func anyTerm(v map[string]any) (*ast.Term, error) {
	if len(v) == 0 {
		return ast.NewTerm(ast.NewObject()), nil
	}
	val, err := ast.InterfaceToValue(v)
	if err != nil {
		return nil, err
	}
	return ast.NewTerm(val), nil
}
