package gateway

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonscan"
)

// A sandbox's message is read once (the guard refused first every message JSON readers read
// differently: jsonscan.Unambiguous), and what the gateway reads of it is what policy decides
// and what an upstream gets: members are matched as encoding/json matches them (after
// unescaping, without regard to case), and a forwarded request is the sandbox's bytes with only
// the members the gateway owns rewritten (forward.go).

// sandboxMessage is what the gateway reads of a sandbox's JSON-RPC message.
type sandboxMessage struct {
	Method string
	ID     json.RawMessage // nil for a notification
	Result json.RawMessage
	Error  json.RawMessage
	Params json.RawMessage // nil when absent
	p      params
}

// params are the members of a request's params the gateway reads; each is raw, nil when absent.
type params struct {
	name, uri, arguments, meta, cursor, task, taskID, level, notifications, ref json.RawMessage
	inputResponses, requestState                                                json.RawMessage
}

var paramNames = [...]string{"name", "uri", "arguments", "_meta", "cursor", "task", "taskId", "level",
	"notifications", "ref", "inputResponses", "requestState"}

func (p *params) slot(i int) *json.RawMessage {
	return [...]*json.RawMessage{&p.name, &p.uri, &p.arguments, &p.meta, &p.cursor, &p.task, &p.taskID, &p.level,
		&p.notifications, &p.ref, &p.inputResponses, &p.requestState}[i]
}

var messageNames = [...]string{"method", "id", "result", "error", "params", "jsonrpc"}

// errNotAMessage is a body that is not one JSON-RPC message object.
var errNotAMessage = errors.New("not a JSON-RPC message object")

// readMessage reads body, one unambiguous JSON text, as a JSON-RPC message.
func readMessage(body []byte) (sandboxMessage, error) {
	var m sandboxMessage
	var method, version json.RawMessage
	err := jsonscan.Named(body, messageNames[:], func(i int, val []byte) error {
		switch i {
		case 0:
			method = val
		case 1:
			if string(val) != "null" {
				m.ID = val
			}
		case 2:
			m.Result = val
		case 3:
			m.Error = val
		case 4:
			if string(val) != "null" {
				m.Params = val
			}
		case 5:
			version = val
		}
		return nil
	})
	if err != nil {
		return m, errNotAMessage
	}
	if method != nil && string(method) != "null" {
		if json.Unmarshal(method, &m.Method) != nil || m.Method == "" {
			return m, errNotAMessage
		}
	}
	if version != nil && string(version) != `"2.0"` {
		return m, errNotAMessage
	}
	if m.ID != nil && !validID(m.ID) {
		return m, errNotAMessage
	}
	if m.Params != nil {
		if m.Params[0] != '{' {
			return m, errNotAMessage // by-position params are not MCP's
		}
		_ = jsonscan.Named(m.Params, paramNames[:], func(i int, val []byte) error {
			if string(val) != "null" {
				*m.p.slot(i) = val
			}
			return nil
		})
	}
	return m, nil
}

// validID reports a JSON-RPC ID MCP allows: a string or an integer.
func validID(id json.RawMessage) bool {
	if id[0] == '"' {
		return true
	}
	var n json.Number
	if json.Unmarshal(id, &n) != nil {
		return false
	}
	_, err := n.Int64()
	return err == nil
}

// isRequest reports a message that asks for an answer.
func (m sandboxMessage) isRequest() bool { return m.Method != "" && m.ID != nil }

// isResponse reports a sandbox's answer to a request of the gateway's.
func (m sandboxMessage) isResponse() bool {
	return m.Method == "" && (m.Result != nil || m.Error != nil)
}

// requestMeta is what a request's _meta says: its progress token, and on 2026-07-28 the
// protocol's per-request fields.
type requestMeta struct {
	progressToken json.RawMessage
	version       string
	caps          *mcp.ClientCapabilities
	capsRaw       json.RawMessage // caps as the sandbox wrote them
	level         mcp.LoggingLevel
}

var metaNames = [...]string{"progressToken", mcp.MetaKeyProtocolVersion, mcp.MetaKeyClientCapabilities, mcp.MetaKeyLogLevel}

// readMeta reads a request's _meta.
func readMeta(meta json.RawMessage) requestMeta {
	var rm requestMeta
	if meta == nil {
		return rm
	}
	_ = jsonscan.Named(meta, metaNames[:], func(i int, val []byte) error {
		switch i {
		case 0:
			if string(val) != "null" {
				rm.progressToken = val
			}
		case 1:
			rm.version = jsonscan.String(val)
		case 2:
			var c mcp.ClientCapabilities
			if json.Unmarshal(val, &c) == nil {
				rm.caps, rm.capsRaw = &c, val
			}
		case 3:
			rm.level = mcp.LoggingLevel(jsonscan.String(val))
		}
		return nil
	})
	return rm
}

// isProtocolKey reports a _meta key of the protocol's own, which describes the hop it is on.
func isProtocolKey(k string) bool { return strings.HasPrefix(k, protocolMetaPrefix) }
