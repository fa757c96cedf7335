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
	} else if p, ok := params.(relayed); ok {
		req.Params = p.encode(nil)
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
		return nil, newReplyError(res.Error)
	}
	if res.Result == nil {
		return nil, transport.NewError(errors.New("upstream response has no result"))
	}
	return res.Result, nil
}

// modernParams adds the 2026-07-28 per-request metadata to params and returns the standard
// headers of the request: params are forwarded ones (relayed), or Sandgate's own (of any shape
// that encodes as an object), made a relayed first.
func modernParams(cli *client.Client, version, method string, params any) (any, http.Header, error) {
	p, ok := params.(relayed)
	if !ok {
		var b []byte
		if params != nil {
			var err error
			if b, err = json.Marshal(params); err != nil {
				return nil, nil, fmt.Errorf("%s: encode params: %w", method, err)
			}
		}
		if len(b) > 0 && b[0] != '{' {
			return nil, nil, fmt.Errorf("%s: params are not an object", method)
		}
		p.members, p.meta = splitMeta(b)
		p.name, p.named = mcp.ExtractHeaderName(mcp.MCPMethod(method), b)
	}
	return p.modern(cli, version, method)
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
