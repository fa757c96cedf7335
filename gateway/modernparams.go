package gateway

import (
	"encoding/json"
	"runtime"
	"sync"
	"weak"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/sandgate/sandgate/internal/jsonenc"
)

// A forwarded request to a 2026-07-28 upstream carries the upstream hop's protocol fields in its
// _meta: they are one fragment, encoded once per upstream connection (relayparams.go adds it to
// the sandbox's params as they are), instead of through json.Marshal of mcp-go's Meta (a map
// built and sorted per call, the capabilities struct encoded by reflection each time).

// fragmentKey names the protocol fragment of one upstream connection and revision. The
// connection is held weakly: a closed one's fragment is dropped when it is collected.
type fragmentKey struct {
	cli     weak.Pointer[client.Client]
	version string
}

var protocolFragments sync.Map // fragmentKey → []byte

// protocolFragment is the _meta members that protocolMeta adds, encoded: the same four
// fields, without the braces.
func protocolFragment(cli *client.Client, version string) ([]byte, error) {
	k := fragmentKey{weak.Make(cli), version}
	if f, ok := protocolFragments.Load(k); ok {
		return f.([]byte), nil
	}
	var f []byte
	for i, kv := range []struct {
		key string
		val any
	}{
		{mcp.MetaKeyProtocolVersion, version},
		{mcp.MetaKeyClientCapabilities, cli.GetClientCapabilities()},
		{mcp.MetaKeyClientInfo, clientInfo},
		{mcp.MetaKeyLogLevel, mcp.LoggingLevelDebug},
	} {
		v, err := json.Marshal(kv.val)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			f = append(f, ',')
		}
		f = append(jsonenc.AppendString(f, kv.key), ':')
		f = append(f, v...)
	}
	if _, loaded := protocolFragments.LoadOrStore(k, f); !loaded {
		runtime.AddCleanup(cli, func(k fragmentKey) { protocolFragments.Delete(k) }, k)
	}
	return f, nil
}

// requestFragment is the upstream hop's protocol fields of one request: the connection's
// (protocolFragment), unless own is set: then the client capabilities are caps (what the sandbox
// the request is forwarded for can answer) and the log level level ("": none, and a 2026-07-28
// upstream then sends no log message).
func requestFragment(cli *client.Client, version string, caps json.RawMessage, level mcp.LoggingLevel, own bool) ([]byte, error) {
	if !own {
		return protocolFragment(cli, version)
	}
	if caps == nil {
		caps = json.RawMessage(`{}`)
	}
	info, err := json.Marshal(clientInfo)
	if err != nil {
		return nil, err
	}
	f := append(jsonenc.AppendString(nil, mcp.MetaKeyProtocolVersion), ':')
	f = append(jsonenc.AppendString(f, version), ',')
	f = append(append(jsonenc.AppendString(f, mcp.MetaKeyClientCapabilities), ':'), caps...)
	f = append(append(jsonenc.AppendString(append(f, ','), mcp.MetaKeyClientInfo), ':'), info...)
	if level != "" {
		f = append(jsonenc.AppendString(append(f, ','), mcp.MetaKeyLogLevel), ':')
		f = jsonenc.AppendString(f, string(level))
	}
	return f, nil
}
