package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// What a forwarded request carries upstream is the sandbox's params as it wrote them (arguments
// byte for byte: integers past 2^53 keep their digits, keys their order), with only the members
// that belong to Sandgate's hop rewritten:
//   - name (tools/call, prompts/get) and completion's ref.name: the upstream's own name, where a
//     prefix renamed it;
//   - _meta: the sandbox's progress token replaced by Sandgate's (bridge.go), the protocol's
//     "io.modelcontextprotocol/" keys (which describe the sandbox's hop) dropped, and on a
//     2026-07-28 upstream the upstream hop's own added (modernparams.go);
//   - requestState and inputResponses (2026-07-28's multi round-trip): sent to a 2026-07-28
//     upstream with the upstream's own state (mrtr.go), never to an older one;
//   - task: sent only to an upstream of the revision the sandbox speaks (tasks.go).
// Nothing of the sandbox's HTTP request travels on: no header, no Authorization.

// relayed is a request's params as the gateway forwards them.
type relayed struct {
	members []byte // the params' members but _meta, comma-separated, without braces
	meta    []byte // the _meta members to keep, comma-separated, without braces
	token   string // Sandgate's progress token ("": the sandbox asked for no progress)
	// own is the sandbox's own progress token, sent as it wrote it on the sandbox's own upstream
	// session (no other sandbox's calls share it), as a direct client's would be.
	own json.RawMessage
	// hop says the request declares its sandbox's capabilities and log level upstream (caps,
	// level) rather than the connection's.
	hop   bool
	caps  json.RawMessage
	level mcp.LoggingLevel
	name  string // what Mcp-Name says on 2026-07-28
	named bool
	tool  json.RawMessage // the tool's definition, for its Mcp-Param headers (tools/call)
}

// relayParams is the request's params for its upstream.
func (x *exchange) relayParams() relayed {
	p := relayed{name: x.name, named: mcp.MethodRequiresNameHeader(mcp.MCPMethod(x.msg.Method))}
	p.hop, p.caps, p.level = x.hopCapabilities()
	if x.msg.Params == nil {
		return p
	}
	p.members = make([]byte, 0, len(x.msg.Params)+len(x.name))
	_ = jsonscan.Members(x.msg.Params, func(key []byte, escaped bool, val []byte) error {
		name, _ := jsonscan.KeyName(key, escaped)
		switch strings.ToLower(name) {
		case "name":
			p.add(`"name"`, jsonenc.AppendString(nil, x.name))
		case "ref":
			p.add(`"ref"`, renamed(val, "name", x.name))
		case "_meta":
			p.meta = hopMeta(val)
		case "requeststate", "inputresponses", "task":
			// the hop's own (mrtr.go, tasks.go) or the revision's: added where they apply
		default:
			p.add(string(key), val)
		}
		return nil
	})
	p.tool = x.def
	return p
}

// hopCapabilities are what x's request declares upstream of its sandbox (relayed.hop): on
// 2026-07-28 the capabilities and log level the sandbox's request declares (as it would have
// declared them directly: an upstream makes a task, or asks for input, only for a client that can
// take it); before it, those its session declared, and every log level (the session's own level
// filters them).
func (x *exchange) hopCapabilities() (bool, json.RawMessage, mcp.LoggingLevel) {
	switch {
	case x.modern:
		return true, x.meta.capsRaw, x.meta.level
	case x.session != nil:
		if caps, known := x.session.capabilities(); known {
			b, _ := json.Marshal(caps)
			return true, b, mcp.LoggingLevelDebug
		}
	}
	return false, nil, ""
}

// add appends a member.
func (p *relayed) add(key string, val []byte) {
	if len(p.members) > 0 {
		p.members = append(p.members, ',')
	}
	p.members = append(append(append(p.members, key...), ':'), val...)
}

// hopMeta is meta, the sandbox's _meta, without its progress token and the protocol's keys.
func hopMeta(meta []byte) []byte {
	var out []byte
	_ = jsonscan.Members(meta, func(key []byte, escaped bool, val []byte) error {
		name, _ := jsonscan.KeyName(key, escaped)
		if isProtocolKey(name) || strings.EqualFold(name, "progressToken") {
			return nil
		}
		if len(out) > 0 {
			out = append(out, ',')
		}
		out = append(append(append(out, key...), ':'), val...)
		return nil
	})
	return out
}

// encode is the params object, with frag (the upstream hop's protocol fields, "" for none) in
// its _meta.
func (p relayed) encode(frag []byte) json.RawMessage {
	b := make([]byte, 0, len(p.members)+len(p.meta)+len(frag)+48)
	b = append(append(b, '{'), p.members...)
	if len(p.meta) > 0 || p.token != "" || p.own != nil || len(frag) > 0 {
		if len(p.members) > 0 {
			b = append(b, ',')
		}
		b = append(b, `"_meta":{`...)
		n := 0
		for _, part := range [][]byte{p.meta, tokenMember(p.token, p.own), frag} {
			if len(part) == 0 {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			b = append(b, part...)
			n++
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

func tokenMember(token string, own json.RawMessage) []byte {
	switch {
	case own != nil:
		return append([]byte(`"progressToken":`), own...)
	case token == "":
		return nil
	}
	return jsonenc.AppendString([]byte(`"progressToken":`), token)
}

// with is p with a member added (the hop's requestState, inputResponses or task).
func (p relayed) with(key string, val []byte) relayed {
	p.members = append([]byte(nil), p.members...)
	p.add(string(jsonenc.AppendString(nil, key)), val)
	return p
}

// modern is p as a 2026-07-28 upstream reads it: its protocol fields added, and the standard
// headers (Mcp-Method, Mcp-Name, Mcp-Param-*).
func (p relayed) modern(cli *client.Client, version, method string) (json.RawMessage, http.Header, error) {
	frag, err := requestFragment(cli, version, p.caps, p.level, p.hop)
	if err != nil {
		return nil, nil, err
	}
	h := standardHeaders(version, method, p.name, p.named)
	if h == nil {
		h = http.Header{}
	}
	if len(p.tool) > 0 && bytes.Contains(p.tool, []byte("x-mcp-header")) {
		var t mcp.Tool
		if json.Unmarshal(p.tool, &t) == nil {
			raw := p.encode(nil)
			for k, v := range mcp.GenerateParamHeaders(&t, raw) {
				h.Set(k, v)
			}
		}
	}
	return p.encode(frag), h, nil
}

// adaptResult is an upstream's result for the sandbox, as the upstream wrote it but for the
// hop's own fields: the upstream's protocol _meta keys (its serverInfo) are dropped; a legacy
// sandbox gets none of a 2026-07-28 upstream's revision fields; a 2026-07-28 sandbox always gets one ("complete" when the upstream,
// of an older revision, wrote none) and, on resources/read, the caching fields, private (what
// a sandbox may read is its own). isError reports a tool's error result.
func (x *exchange) adaptResult(raw json.RawMessage) (out []byte, isError bool, err error) {
	out = make([]byte, 0, len(raw)+48)
	out = append(out, '{')
	n, typed, cached := 0, false, false
	err = jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		name, err := jsonscan.KeyName(key, escaped)
		if err != nil {
			return err
		}
		switch {
		case name == "_meta" && len(val) > 0 && val[0] == '{':
			if val, err = withoutProtocolMeta(val); err != nil || val == nil {
				return err
			}
		case name == "isError":
			isError = string(val) == "true"
		case name == "resultType" || name == "ttlMs" || name == "cacheScope" || name == "inputRequests" || name == "requestState":
			// A legacy sandbox is not shown the fields of a revision it does not speak; what a
			// legacy upstream wrote under these names is its own, relayed as it wrote it.
			if !x.modern && x.upModern {
				return nil
			}
			typed = typed || name == "resultType"
			if name == "cacheScope" && x.modern && x.msg.Method == string(mcp.MethodResourcesRead) {
				cached, val = true, []byte(`"private"`)
			}
		}
		if n > 0 {
			out = append(out, ',')
		}
		n++
		out = append(append(append(out, key...), ':'), val...)
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	if x.modern && !typed {
		out = jsonenc.AppendMember(out, &n, "resultType", []byte(`"complete"`))
	}
	if x.modern && !cached && x.msg.Method == string(mcp.MethodResourcesRead) {
		out = jsonenc.AppendMember(out, &n, "cacheScope", []byte(`"private"`))
		if !bytes.Contains(raw, []byte(`"ttlMs"`)) {
			out = jsonenc.AppendMember(out, &n, "ttlMs", []byte("0"))
		}
	}
	return append(out, '}'), isError, nil
}

// withoutProtocolMeta is meta, a result's _meta, without the protocol's own
// "io.modelcontextprotocol/" keys, which describe the upstream's hop (a 2026-07-28 server's
// serverInfo), as they are stripped from requests (hopMeta); nil when nothing is left of a _meta
// that held only those.
func withoutProtocolMeta(meta []byte) ([]byte, error) {
	out := make([]byte, 0, len(meta))
	out = append(out, '{')
	kept, dropped := 0, 0
	err := jsonscan.Members(meta, func(key []byte, escaped bool, val []byte) error {
		name, err := jsonscan.KeyName(key, escaped)
		if err != nil {
			return err
		}
		if isProtocolKey(name) {
			dropped++
			return nil
		}
		if kept > 0 {
			out = append(out, ',')
		}
		kept++
		out = append(append(append(out, key...), ':'), val...)
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case dropped == 0:
		return meta, nil
	case kept == 0:
		return nil, nil
	}
	return append(out, '}'), nil
}
