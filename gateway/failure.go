package gateway

import (
	"errors"
	"fmt"

	"github.com/sandgate/sandgate/internal/call"
)

// A forwarded call whose upstream failed is answered in Sandgate's words (issue 59, security
// invariant 11): the error of a transport, a parser or a connection quotes what the upstream
// sent (a status line, a body, a header, a JSON-RPC error's message), so the sandbox reads the
// upstream's name and its code's fixed reason (call.UpstreamFailure), and the call's event
// keeps the words as its detail, scrubbed of credentials. Texts the gateway writes from what
// it knows itself (a breaker open, an input request it cannot serve) are read as they are.

// fail ends cl (when there is one) as failed with code for err and returns the error the
// sandbox reads. A credential in err's words means the upstream sent it back: the event says
// credential_echoed, though the words reach no sandbox.
func (u *upstream) fail(cl *call.Call, code string, err error) error {
	detail, echoed := err.Error(), false
	if u.guard != nil {
		detail, echoed = u.guard.Current().ScrubString(detail)
	}
	rf := call.UpstreamFailure(code, detail)
	if cl != nil {
		if echoed {
			cl.CredentialEchoed()
		}
		cl.Fail(rf)
	}
	var ie *inputError
	if errors.Is(err, errBreakerOpen) || errors.As(err, &ie) {
		// Not yet all Sandgate's words: the text of an input request of a method no sandbox
		// serves names that method, as the upstream wrote it (left to issue 56's relay).
		return fmt.Errorf("upstream %s (%s): %w", u.cfg.Name, rf.Code, err)
	}
	return fmt.Errorf("upstream %s: %s (%s)", u.cfg.Name, rf.Reason, rf.Code)
}
