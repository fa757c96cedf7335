package audit

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/identity"
)

func TestFitEventCutsALongEventToItsSlot(t *testing.T) {
	long := strings.Repeat("é", 4000) // two bytes a rune: a cut must not split one
	ev := &Event{ID: newID(time.Now()), Time: time.Now(), Kind: KindHTTPRequest,
		Identity: identity.Identity{Namespace: long, Sandbox: long, Template: long, Claim: long,
			Labels: map[string]string{"a": long}, SourceIP: "127.0.0.2", Known: true},
		Target:   Target{Host: long, Path: long, Route: long, Model: long, Method: "POST"},
		Decision: Decision{Allow: true, Reason: long, PolicyRevision: "rev-1"},
		Outcome:  Outcome{Status: 200, Error: long, DurationMS: 1.5, BytesIn: 7}}
	require.Greater(t, lineBytes(ev), int64(SlotBytes))
	fitEvent(ev, SlotBytes)
	assert.LessOrEqual(t, lineBytes(ev), int64(SlotBytes))
	assert.True(t, utf8.ValidString(ev.Target.Path))
	assert.True(t, strings.HasSuffix(ev.Target.Path, "…"))
	assert.Equal(t, 200, ev.Outcome.Status, "numbers and the decision stay")
	assert.True(t, ev.Decision.Allow)
	assert.Equal(t, "127.0.0.2", ev.Identity.SourceIP)
}

func TestReserveBoundsWhatTheWriterOwes(t *testing.T) {
	sink, err := OpenFileSink(FileConfig{Dir: t.TempDir(), Fsync: FsyncNever, Reserve: MinReserve})
	require.NoError(t, err)
	w := NewWriter(sink)
	defer w.Close(t.Context())
	var slots []Slot
	for {
		s, err := w.Reserve()
		if err != nil {
			require.ErrorIs(t, err, ErrReserveExhausted)
			break
		}
		slots = append(slots, s)
	}
	assert.Len(t, slots, (MinReserve-reserveMargin)/SlotBytes, "as many slots as the reserve holds")
	assert.ErrorIs(t, w.Record(&Event{Kind: KindToolsCall}), ErrReserveExhausted, "an event without a slot needs room too")
	for _, s := range slots {
		require.NoError(t, w.RecordReserved(&Event{Kind: KindToolsCall}, s))
	}
	require.NoError(t, w.Close(t.Context()))
	st := w.Stats()
	assert.EqualValues(t, len(slots), st.Written)
	assert.Zero(t, st.ReserveOwed, "written events give their room back")
}

func TestLineBoundIsAnUpperBound(t *testing.T) {
	for _, ev := range []*Event{
		{Kind: KindToolsCall},
		{ID: newID(time.Now()), Time: time.Now(), Kind: KindToolsCall, TraceID: strings.Repeat("a", 32),
			Identity: identity.Identity{Namespace: "ns", Sandbox: "s\x00\x01\"", Labels: map[string]string{"k": "\xff\xfe"}},
			Target:   Target{Upstream: "u", Tool: "<t>&", Path: "\\\\\n"}, Decision: Decision{Reason: "\u2028"},
			Outcome: Outcome{Status: 599, DurationMS: 123456789.123, BytesIn: 1 << 62, BytesOut: 1 << 62, TokensIn: 1 << 62, TokensOut: 1 << 62, CredentialEchoed: true}},
	} {
		assert.GreaterOrEqual(t, lineBound(ev), lineBytes(ev))
	}
}
