package proxy

import (
	"context"
	"errors"

	"github.com/sandgate/sandgate/internal/call"
)

// A sandbox may go away before its answer is complete: it cancels a stream (the Anthropic SDK's
// stream.controller.abort(), a closed connection) or gives up waiting. The call's event says so:
// a stream cut by its reader after its answer began is outcome.error client_closed with the
// status the sandbox got (200); a sandbox gone before any answer is cancelled (499), as on the
// MCP half. What the sandbox read (bytes_out, tokens) is what was relayed until then.
//
// The proxy learns of it two ways: a write to the sandbox fails (statusWriter), or the
// request's context ends (the connection server's watch saw the connection close) for any
// cause but the shutdown's, whose events say shutdown.

// clientGone reports whether the sandbox behind ctx, a request's context, went away.
func clientGone(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), call.ErrShutdown)
}
