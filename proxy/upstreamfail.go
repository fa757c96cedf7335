package proxy

import (
	"context"
	"errors"
	"net/http"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/respguard"
)

// errPartial refuses a partial response to a credentialed request (upstream_partial).
var errPartial = errors.New("partial response to a request that carried a credential")

// upstreamError answers a request whose upstream could not be reached or failed. A
// destination the dial guard refuses is a denial (403, the guard's reason); a name that does
// not resolve or a failed dial is the upstream's failure (502, 504 on a timeout), not a
// decision. The answer's words are Sandgate's own; what failed, in the transport's words, is
// the event's detail, scrubbed. A sandbox that went away before an answer gets none: its call
// is cancelled (499), as on the MCP half.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeFrom(r.Context())
	if clientGone(r.Context()) {
		end := call.Cancelled()
		x.ended = &end
		return
	}
	rf := upstreamRefusal(err)
	if x.body.Cut() {
		rf = call.Refuse(call.CodeBodyTimeout, "request body not received in time")
	}
	rf.Detail, _ = p.scrub.Current().ScrubString(rf.Detail)
	writeRefusal(w, rf, x.openAI())
	x.status = rf.Status()
	end := call.Failed(rf)
	if rf.Class() == call.ClassPolicy {
		end = call.Denied(rf)
	}
	x.ended = &end
}

// upstreamRefusal classifies an upstream error: a dial-guard denial keeps the guard's reason
// code; resolution failures, dial failures and timeouts are upstream errors with the cause. A
// name that does not resolve or a dial that fails is "upstream unreachable (resolve NAME: …)" or
// "(dial HOST:PORT: …)", never a denial: no policy was involved. Those words are the
// sandbox's name and the resolver's or kernel's; every other failure is answered with its
// code's fixed reason (call.UpstreamFailure), since the transport's error quotes what the
// upstream sent (a malformed status line or header, a certificate's names).
func upstreamRefusal(err error) *call.Refusal {
	var de *DialError
	if errors.As(err, &de) {
		rf := dialRefusal(err, de)
		rf.Detail = err.Error()
		return rf
	}
	code := call.CodeUpstreamError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = call.CodeUpstreamTimeout
	case errors.Is(err, respguard.ErrEncoding):
		code = call.CodeUpstreamEncoding
	case errors.Is(err, errPartial):
		code = call.CodeUpstreamPartial
	}
	return call.UpstreamFailure(code, err.Error())
}

// dialRefusal is the refusal of a destination the dial guard refused or could not reach.
func dialRefusal(err error, de *DialError) *call.Refusal {
	switch de.Reason {
	case "":
		// Nothing answered (refused, unreachable): unavailable, 503, as the gateway answers
		// a call to an upstream that is down; 502 is kept for an upstream that answered badly.
		code := call.CodeUpstreamUnavailable
		if errors.Is(err, context.DeadlineExceeded) {
			code = call.CodeUpstreamTimeout
		}
		return call.Refuse(code, "upstream unreachable (%v)", de)
	case DenyResolve, DenyNoAddress:
		return call.Refuse(string(de.Reason), "upstream unreachable (%v)", de)
	}
	return call.Refuse(string(de.Reason), "destination denied by dial guard: %s", de.Reason)
}
