package policy

import (
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/sandgate/sandgate/identity"
)

// Kinds of actions, the values of input.kind.
const (
	KindToolsList     = "mcp.tools_list"
	KindToolsCall     = "mcp.tools_call"
	KindResourcesRead = "mcp.resources_read"
	KindPromptsGet    = "mcp.prompts_get"
	KindHTTPConnect   = "http.connect"
	KindHTTPRequest   = "http.request"
)

// Input is the policy input contract (ARCHITECTURE.md, "Policy contract"). The one place that
// turns a call into what policy sees; gateway and proxy fill it, Engine.Decide evaluates it.
type Input struct {
	Kind     string
	Identity identity.Identity
	MCP      *MCP  // for mcp.* kinds
	HTTP     *HTTP // for http.* kinds
	// Grants are the caller's grants registered through the admin API, by name.
	Grants map[string]any
	// Usage is the caller's current consumption (requests per minute, tokens today …), by name.
	Usage map[string]int64
}

// MCP is input.mcp: the upstream server, the tool (or resource URI, prompt name) and the
// call's arguments as decoded JSON.
type MCP struct {
	Upstream  string
	Tool      string
	Arguments map[string]any
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
	id := in.Identity
	labels := ast.NewObject()
	for k, v := range id.Labels {
		labels.Insert(ast.StringTerm(k), ast.StringTerm(v))
	}
	idObj := ast.NewObject(
		ast.Item(kNamespace, ast.StringTerm(id.Namespace)),
		ast.Item(kSandbox, ast.StringTerm(id.Sandbox)),
		ast.Item(kTemplate, ast.StringTerm(id.Template)),
		ast.Item(kClaim, ast.StringTerm(id.Claim)),
		ast.Item(kLabels, ast.NewTerm(labels)),
		ast.Item(kSourceIP, ast.StringTerm(id.SourceIP)),
		ast.Item(kKnown, ast.BooleanTerm(id.Known)),
	)
	obj := ast.NewObject(
		ast.Item(kKind, ast.StringTerm(in.Kind)),
		ast.Item(kIdentity, ast.NewTerm(idObj)),
	)
	grants, err := anyTerm(in.Grants)
	if err != nil {
		return nil, fmt.Errorf("input.grants: %w", err)
	}
	obj.Insert(kGrants, grants)
	usage := ast.NewObject()
	for k, v := range in.Usage {
		usage.Insert(ast.StringTerm(k), ast.IntNumberTerm(int(v)))
	}
	obj.Insert(kUsage, ast.NewTerm(usage))
	if m := in.MCP; m != nil {
		args, err := anyTerm(m.Arguments)
		if err != nil {
			return nil, fmt.Errorf("input.mcp.arguments: %w", err)
		}
		obj.Insert(kMCP, ast.ObjectTerm(
			ast.Item(kUpstream, ast.StringTerm(m.Upstream)),
			ast.Item(kTool, ast.StringTerm(m.Tool)),
			ast.Item(kArguments, args),
		))
	}
	if h := in.HTTP; h != nil {
		obj.Insert(kHTTP, ast.ObjectTerm(
			ast.Item(kMethod, ast.StringTerm(h.Method)),
			ast.Item(kHost, ast.StringTerm(h.Host)),
			ast.Item(kPort, ast.IntNumberTerm(h.Port)),
			ast.Item(kPath, ast.StringTerm(h.Path)),
			ast.Item(kRoute, ast.StringTerm(h.Route)),
			ast.Item(kModel, ast.StringTerm(h.Model)),
			ast.Item(kMaxTokens, ast.IntNumberTerm(int(h.MaxTokens))),
			ast.Item(kStream, ast.BooleanTerm(h.Stream)),
		))
	}
	return obj, nil
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
