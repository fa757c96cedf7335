package call_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// downRecorder is an audit log that cannot take an event (a failing disk).
type downRecorder struct{}

func (downRecorder) Record(*audit.Event) error { return audit.ErrUnhealthy }
func (downRecorder) Healthy() error            { return fmt.Errorf("%w: disk failing", audit.ErrUnhealthy) }

// TestARejectionTheAuditLogCannotTakeIsAnsweredAuditUnavailable: a request refused before it is
// a call (malformed, foreign Host, no session …) is answered with audit_unavailable when the
// audit log has no room for its event (every slot of a real writer's reserve taken) or cannot
// write (a failing sink), its own refusal's Close kept; suppressed rejections too. With room,
// the rejection is answered as itself.
func TestARejectionTheAuditLogCannotTakeIsAnsweredAuditUnavailable(t *testing.T) {
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: t.TempDir(), Fsync: audit.FsyncNever, Reserve: audit.MinReserve})
	require.NoError(t, err)
	w := audit.NewWriter(sink, audit.WithDelivery(audit.DeliveryBlocking))
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	core, err := call.New(call.Options{Audit: w, Policy: fixedDecider{policy.Decision{Allow: true, Revision: "r1"}}})
	require.NoError(t, err)
	id := identity.Identity{SourceIP: "10.0.0.1", Known: true}
	malformed := func() *call.Refusal {
		rf := call.Refuse(call.CodeMalformedRequest, "parse error")
		rf.Close = true
		return rf
	}

	got := core.Reject(context.Background(), audit.KindMCPRejected, id, audit.Target{}, malformed())
	assert.Equal(t, call.CodeMalformedRequest, got.Code, "with room, the rejection is itself")

	var slots []audit.Slot
	for {
		s, err := w.Reserve()
		if err != nil {
			break
		}
		slots = append(slots, s)
	}
	got = core.Reject(context.Background(), audit.KindMCPRejected, id, audit.Target{}, malformed())
	assert.Equal(t, call.CodeAuditUnavailable, got.Code, "no slot: nothing is answered but the fail-closed refusal")
	assert.Equal(t, 503, got.Status())
	assert.True(t, got.Close, "the connection still closes after a malformed request")
	for _, s := range slots {
		w.Release(s)
	}

	down, err := call.New(call.Options{Audit: downRecorder{}, Policy: fixedDecider{policy.Decision{Allow: true}},
		Rejections: call.RejectionLimit{PerWindow: 1, Window: time.Hour}})
	require.NoError(t, err)
	for i, what := range []string{"written", "suppressed"} {
		got := down.Reject(context.Background(), audit.KindHTTPRejected, id, audit.Target{}, call.Refuse(call.CodeBadHost, "no"))
		assert.Equal(t, call.CodeAuditUnavailable, got.Code, "rejection %d (%s) on a failing log", i+1, what)
	}
}
