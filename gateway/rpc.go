package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// headers of the request.
func modernParams(cli *client.Client, version, method string, params any) (any, http.Header, error) {
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
	meta[mcp.MetaKeyProtocolVersion] = version
	meta[mcp.MetaKeyClientCapabilities] = cli.GetClientCapabilities()
	meta[mcp.MetaKeyClientInfo] = clientInfo
	// Every log message: each sandbox session's own level filters them.
	meta[mcp.MetaKeyLogLevel] = mcp.LoggingLevelDebug
	b, err := json.Marshal(meta)
	if err != nil {
		return nil, nil, err
	}
	fields["_meta"] = b
	encoded, err := json.Marshal(fields)
	if err != nil {
		return nil, nil, err
	}
	h := http.Header{}
	for k, v := range mcp.StandardHeaders(version, mcp.MCPMethod(method), encoded) {
		h.Set(k, v)
	}
	return fields, h, nil
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
