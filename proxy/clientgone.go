package proxy

import (
	"context"
	"errors"

	"github.com/sandgate/sandgate/internal/call"
)

// A sandbox may go away before its answer is complete: it cancels a stream (the Anthropic SDK's
// stream.controller.abort(), a closed connection) or gives up waiting. The call's event says so
// with outcome.error client_closed and the status the sandbox got, if any: 200 for a stream
// cut by its reader, 0 when nothing was answered. What the sandbox reported having read
// (bytes_out, tokens) is what was relayed until then.
//
// The proxy learns of it two ways: a write to the sandbox fails (statusWriter), or the
// request's context ends (the connection server's watch saw the connection close) for any
// cause but the shutdown's, whose events say shutdown.

// clientGone reports whether the sandbox behind ctx, a request's context, went away.
func clientGone(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), call.ErrShutdown)
}
