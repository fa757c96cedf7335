package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/sandgate/sandgate/internal/call"
)

// An MCP client takes a call as answered when the JSON-RPC response arrives, and in an SSE
// stream that is an event before the end of the body. With blocking audit delivery the guard's
// writer keeps back the end of that event (from its last non-blank byte, the closing bracket, on)
// until the call has finished, its event written, and never sends it when the write was not
// confirmed (call.Release). Every other event of the stream, notifications and requests to the
// client (sampling, elicitation) included, goes out as mcp-go flushes it. A JSON body needs
// nothing here: the connection server holds the end of every body (internal/httpconn).
//
// The response guard (scrubwriter.go) sits in front of this writer and may pass the response
// event on in two writes (it held back what could begin a credential); the second, written when
// the guard ends before the call finishes, is not recognised here, but nothing flushes it: the
// connection server keeps its end back until the handler returns, after the event's write.

// holdFinal says whether the answer to r waits for its call's event: a POST (one message,
// whose response ends the exchange) under blocking delivery.
func holdFinal(ctx context.Context, r *http.Request) bool {
	return r.Method == http.MethodPost && call.ReleaseFrom(ctx).Holds()
}

// sseResponse reports whether p, one write of an SSE stream (mcp-go writes one event per write),
// carries a JSON-RPC response: a message with a result or an error and no method.
func sseResponse(p []byte) bool {
	for line := range bytes.Lines(p) {
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		msg, ok := scanMessage(data)
		if !ok && json.Unmarshal(data, &msg) != nil {
			continue
		}
		if msg.Method == "" && (msg.Result != nil || msg.Error != nil) {
			return true
		}
	}
	return false
}

// lastSolid is the index of p's last byte that is not white space, -1 when there is none.
func lastSolid(p []byte) int {
	return bytes.LastIndexFunc(p, func(r rune) bool { return !strings.ContainsRune(" \t\r\n", r) })
}

// writeHeld writes p but for its end, which it keeps in c.final, when p carries the response
// of a held answer in an SSE stream; it reports whether it did.
func (c *countingWriter) writeHeld(p []byte) (bool, error) {
	if len(c.final) > 0 { // more after the response: what was held goes first
		if _, err := c.ResponseWriter.Write(c.final); err != nil {
			return true, err
		}
		c.final = c.final[:0]
	}
	if !c.hold || !strings.HasPrefix(c.Header().Get("Content-Type"), "text/event-stream") || !sseResponse(p) {
		return false, nil
	}
	i := lastSolid(p)
	if i < 0 {
		return false, nil
	}
	if _, err := c.ResponseWriter.Write(p[:i]); err != nil {
		return true, err
	}
	c.final = append(c.final[:0], p[i:]...)
	c.n.Add(int64(len(p)))
	return true, nil
}

// release sends the held end of the response once the call has finished, unless its event was
// not confirmed written: then the connection server closes the connection without it.
func (c *countingWriter) release(ctx context.Context) {
	if len(c.final) == 0 || call.ReleaseFrom(ctx).Cut() {
		return
	}
	_, _ = c.ResponseWriter.Write(c.final)
	c.final = nil
	c.Flush()
}
