package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// rpcIDs numbers the requests Sandgate sends upstream itself. They are strings ("sg-N") so that
// they never collide with the integer IDs mcp-go's client gives the requests it sends (the
// handshake) on the same connection.
var rpcIDs atomic.Uint64

// cancelTimeout bounds sending notifications/cancelled for a request the sandbox gave up on.
const cancelTimeout = 5 * time.Second

// rpc sends one JSON-RPC request on cli's connection and returns the result exactly as the
// upstream wrote it. Sandgate sends requests itself, rather than through mcp-go's typed helpers,
// so that:
//   - results reach the sandbox verbatim (typed results drop what mcp-go does not model);
//   - the upstream request ID is known, and a request whose context ends (the sandbox cancelled
//     it, or went away) is cancelled upstream with notifications/cancelled naming that ID, on
//     every transport and protocol revision before 2026-07-28 (on 2026-07-28 and later, over
//     HTTP, closing the request's stream is the cancellation, which the transport does);
//   - the legacy methods some upstreams still need (ping, logging/setLevel,
//     resources/subscribe) are sent as plain protocol messages on the legacy path only.
//
// On a 2026-07-28 connection the request carries the protocol's per-request _meta (protocol
// version, client info, capabilities) and its standard headers, as mcp-go's client adds them.
func rpc(ctx context.Context, cli *client.Client, method string, params any) (json.RawMessage, error) {
	req := transport.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION,
		ID: mcp.NewRequestId("sg-" + strconv.FormatUint(rpcIDs.Add(1), 10)), Method: method, Params: params}
	if v := cli.ProtocolVersion(); mcp.IsModernProtocol(v) {
		var err error
		if req.Params, req.Header, err = modernParams(cli, v, method, params); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, transport.NewError(err)
	}
	res, err := cli.GetTransport().SendRequest(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			cancelUpstream(ctx, cli, req.ID)
		}
		return nil, transport.NewError(err)
	}
	if res.Error != nil {
		return nil, res.Error.AsError()
	}
	if res.Result == nil {
		return nil, transport.NewError(errors.New("upstream response has no result"))
	}
	return res.Result, nil
}

// request forwards one sandbox request and decodes its result with parse, which keeps what
// the sandbox must see verbatim. Sandgate sends it itself (rpc), so that cancelling it reaches
// the upstream; on 2026-07-28 and later roundTrip also runs the multi round-trip exchange of
// that revision (input_required).
func request[R any](ctx context.Context, cli *client.Client, method mcp.MCPMethod, params any,
	parse func(*json.RawMessage) (R, error)) (R, error) {
	send := rpc
	if mcp.IsModernProtocol(cli.ProtocolVersion()) {
		send = roundTrip
	}
	raw, err := send(ctx, cli, string(method), params)
	if err != nil {
		var zero R
		return zero, err
	}
	keepExtras(ctx, string(method), raw)
	return parse(&raw)
}

// parseJSON is a parse function for request that decodes into R.
func parseJSON[R any](raw *json.RawMessage) (*R, error) {
	var r R
	if err := json.Unmarshal(*raw, &r); err != nil {
		return nil, fmt.Errorf("decode result: %w", err)
	}
	return &r, nil
}

// rpcInto is rpc decoding the result into out.
func rpcInto(ctx context.Context, cli *client.Client, method string, params, out any) error {
	raw, err := rpc(ctx, cli, method, params)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s: decode result: %w", method, err)
	}
	return nil
}

// modernParams adds the 2026-07-28 per-request metadata to params and returns the standard
// headers of the request. The forwarded calls' typed params get it in one encoding (the
// params as the upstream will read them, which the transport embeds as they are); anything
// else goes through a generic object merge.
func modernParams(cli *client.Client, version, method string, params any) (any, http.Header, error) {
	var name string
	var encoded []byte
	var err error
	switch p := params.(type) {
	case mcp.CallToolParams:
		var fast bool
		if encoded, fast, err = toolCallParams(cli, version, p); !fast && err == nil {
			p.Meta = protocolMeta(cli, version, p.Meta)
			encoded, err = json.Marshal(p)
		}
		name = p.Name
	case mcp.GetPromptParams:
		p.Meta, name = protocolMeta(cli, version, p.Meta), p.Name
		encoded, err = json.Marshal(p)
	case mcp.ReadResourceParams:
		p.Meta, name = protocolMeta(cli, version, p.Meta), p.URI
		encoded, err = json.Marshal(p)
	default:
		return genericModernParams(cli, version, method, params)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: encode params: %w", method, err)
	}
	return json.RawMessage(encoded), standardHeaders(version, method, name, true), nil
}

// protocolMeta is meta (not changed) with the 2026-07-28 per-request fields added.
func protocolMeta(cli *client.Client, version string, meta *mcp.Meta) *mcp.Meta {
	out := &mcp.Meta{AdditionalFields: make(map[string]any, 4)}
	if meta != nil {
		out.ProgressToken = meta.ProgressToken
		maps.Copy(out.AdditionalFields, meta.AdditionalFields)
	}
	out.AdditionalFields[mcp.MetaKeyProtocolVersion] = version
	out.AdditionalFields[mcp.MetaKeyClientCapabilities] = cli.GetClientCapabilities()
	out.AdditionalFields[mcp.MetaKeyClientInfo] = clientInfo
	// Every log message: each sandbox session's own level filters them.
	out.AdditionalFields[mcp.MetaKeyLogLevel] = mcp.LoggingLevelDebug
	return out
}

// standardHeaders are the headers a 2026-07-28 request repeats its method and target in
// (mcp.StandardHeaders, with the name already known rather than read back from the body).
func standardHeaders(version, method, name string, named bool) http.Header {
	if !mcp.RequiresStandardHeaders(version) {
		return nil
	}
	h := http.Header{}
	h.Set(mcp.HeaderMethod, method)
	if named {
		if v, ok := mcp.EncodeHeaderValue(name); ok {
			h.Set(mcp.HeaderName, v)
		}
	}
	return h
}

// genericModernParams is modernParams for params of any other shape: merged as a JSON object.
func genericModernParams(cli *client.Client, version, method string, params any) (any, http.Header, error) {
	fields := map[string]json.RawMessage{}
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: encode params: %w", method, err)
		}
		if err := json.Unmarshal(b, &fields); err != nil {
			return nil, nil, fmt.Errorf("%s: params are not an object: %w", method, err)
		}
	}
	meta := map[string]any{}
	if raw, ok := fields["_meta"]; ok {
		_ = json.Unmarshal(raw, &meta)
	}
	for k, v := range protocolMeta(cli, version, nil).AdditionalFields {
		meta[k] = v
	}
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, nil, err
	}
	fields["_meta"] = b
	encoded, err := json.Marshal(fields)
	if err != nil {
		return nil, nil, err
	}
	name, named := mcp.ExtractHeaderName(mcp.MCPMethod(method), encoded)
	return fields, standardHeaders(version, method, name, named), nil
}

// clientInfo is how Sandgate introduces itself to upstreams.
var clientInfo = mcp.Implementation{Name: "sandgate", Version: "1"}

// cancelUpstream tells the upstream to stop working on request id. Over HTTP on 2026-07-28
// and later the transport closed the request's stream, which is the cancellation; everywhere
// else a notifications/cancelled is sent, best effort and off the caller's path.
func cancelUpstream(ctx context.Context, cli *client.Client, id mcp.RequestId) {
	_, isHTTP := cli.GetTransport().(transport.HTTPConnection)
	if isHTTP && mcp.IsModernProtocol(cli.ProtocolVersion()) {
		return
	}
	reason := "cancelled by the sandbox"
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		reason = "timed out at Sandgate"
	}
	n := mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
		Method: string(mcp.MethodNotificationCancelled),
		Params: mcp.NotificationParams{AdditionalFields: map[string]any{"requestId": id, "reason": reason}},
	}}
	go func() {
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer cancel()
		_ = cli.GetTransport().SendNotification(nctx, n)
	}()
}
