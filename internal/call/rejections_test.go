package call

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// clockRejections is a rejections limiter on a clock the test moves.
func clockRejections(lim RejectionLimit) (*rejections, *time.Time) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rj := newRejections(lim.withDefaults())
	rj.now = func() time.Time { return now }
	return rj, &now
}

func from(ip string) identity.Identity { return identity.Identity{SourceIP: ip} }

// written counts how many of n rejections of code from ip are written.
func written(rj *rejections, ip, code string, n int) (w int, ended []rejectWindow) {
	for range n {
		e, ok := rj.admit(audit.KindMCPRejected, from(ip), code)
		ended = append(ended, e...)
		if ok {
			w++
		}
	}
	return w, ended
}

func TestSecurityRejectionsOutliveAFloodOfNoise(t *testing.T) {
	rj, now := clockRejections(RejectionLimit{PerWindow: 5, Window: time.Second})
	w, _ := written(rj, "10.0.0.1", CodeMalformedRequest, 100)
	assert.Equal(t, 5, w, "noise within its budget")

	w, _ = written(rj, "10.0.0.1", CodeSessionNotOwned, 1)
	assert.Equal(t, 1, w, "a hijack attempt after the noise is written")
	w, _ = written(rj, "10.0.0.1", CodeSessionNotOwned, 10)
	assert.Equal(t, 4, w, "repeats of it, within the security budget")

	for _, code := range []string{CodeBadOrigin, CodeUnknownCaller, CodeAdminFromSandbox, CodeBadHost} {
		w, _ = written(rj, "10.0.0.1", code, 3)
		assert.Equal(t, 1, w, "%s: the first of each security code is written, budget spent or not", code)
	}
	w, _ = written(rj, "10.0.0.2", CodeMalformedRequest, 5)
	assert.Equal(t, 5, w, "another source has its own budget")

	*now = now.Add(time.Second)
	w, ended := written(rj, "10.0.0.1", CodeSessionNotOwned, 1)
	assert.Equal(t, 1, w, "a new window")
	if assert.Len(t, ended, 1) {
		assert.Equal(t, int64(95+6+4*2), ended[0].suppressed)
		assert.Equal(t, "malformed_request 95, session_not_owned 6, admin_from_sandbox 2, bad_host 2, bad_origin 2, unknown_caller 2",
			suppressedCodes(ended[0].byCode))
	}
}

func TestSecurityRejectionsOfSourcesOverTheTrackedLimit(t *testing.T) {
	rj, now := clockRejections(RejectionLimit{PerWindow: 2, Window: time.Second, MaxSources: 1})
	written(rj, "10.0.0.1", CodeMalformedRequest, 1)
	w, _ := written(rj, "10.0.0.2", CodeMalformedRequest, 10)
	assert.Equal(t, 2, w, "the overflow window has a budget like a source")
	w, _ = written(rj, "10.0.0.3", CodeUnknownCaller, 3)
	assert.Equal(t, 2, w, "security codes of sources over the limit: their own budget")
	w, _ = written(rj, "10.0.0.4", CodeSessionNotOwned, 1)
	assert.Equal(t, 1, w, "and the first of each code")

	*now = now.Add(time.Second)
	_, ended := written(rj, "10.0.0.5", CodeMalformedRequest, 1)
	var overflow *rejectWindow
	for i := range ended {
		if ended[i].id.SourceIP == "" {
			overflow = &ended[i]
		}
	}
	if assert.NotNil(t, overflow, "the overflow's suppressed count is written when its window ends") {
		assert.Equal(t, int64(9), overflow.suppressed)
	}
}
