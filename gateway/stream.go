package gateway

import (
	"context"
	"net/http"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
)

// A GET to /mcp (revisions before 2026-07-28) is the session's stream: its standalone stream
// (sandboxstream.go), where what an upstream sends outside a call goes, or, with a
// Last-Event-ID of a call's stream, that stream resumed (answer.go): what followed that event,
// and then the rest of the call as it comes, its result included. 2026-07-28 has no GET stream
// (405); its list changes and resource updates go to subscriptions/listen (listen.go).

// askStream checks a GET: a session of the caller's, on a revision that has one.
func (x *exchange) askStream() (call.Question, *call.Refusal) {
	if modernRequest(x.r) {
		return call.Question{}, call.Refuse(call.CodeMalformedRequest, "GET has no stream on protocol %s; use subscriptions/listen",
			mcp.ProtocolVersion20260728)
	}
	return call.Question{}, x.session0(true)
}

// serveStream serves the session's stream until the sandbox goes away, another GET takes it
// over, the session ends or, for the standalone stream, the listener drains.
func (x *exchange) serveStream(ctx context.Context) (response, call.End) {
	last := x.r.Header.Get("Last-Event-ID")
	if last == "" {
		return x.serveStandalone(ctx, "")
	}
	stream, ok := x.g.events.streamOf(ctx, x.sid, last)
	switch {
	case !ok:
		rf := call.Refuse(call.CodeBadParams, "unknown Last-Event-ID; send the request again")
		return x.refuseHTTP(rf, nil), call.Denied(rf)
	case stream == listenStream:
		return x.serveStandalone(ctx, last)
	}
	if a := x.session.call(stream); a != nil && a.attach(x.w, last) {
		select { // the call's stream is this GET's until it ends
		case <-a.done:
		case <-ctx.Done():
		case <-x.session.ctx.Done():
		}
		return response{}, call.Answered(http.StatusOK)
	}
	x.out.mu.Lock()
	x.out.startSSE()
	x.out.mu.Unlock()
	x.g.events.replay(x.sid, last, func(id string, msg []byte) { _ = x.w.writeEvent(id, msg, sseWriteTimeout) })
	return response{}, call.Answered(http.StatusOK)
}

// serveStandalone serves the session's standalone stream: it ends when the listener starts
// draining (it is no call waiting for an answer).
func (x *exchange) serveStandalone(ctx context.Context, last string) (response, call.End) {
	ctx, end := context.WithCancel(ctx)
	defer end()
	defer context.AfterFunc(x.g.streams, end)()
	x.session.stream.serve(x.w, x.r.WithContext(ctx), last)
	return response{}, call.Answered(http.StatusOK)
}
