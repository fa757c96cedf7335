package audit

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOTLPLineDecoderAgreesWithParseLine: the exporter's decoder gives a record the same
// event name, time, severity, trace context and attributes as ParseLine's Event would, for
// events of every shape the mapping distinguishes and strings that need escaping.
func TestOTLPLineDecoderAgreesWithParseLine(t *testing.T) {
	evs := append(mappingEvents(), testEvent(1), benchRouteEvent(7),
		Event{Kind: KindHTTPConnect, Decision: Decision{Reason: "host \"evil\" <denied> \u2028 \\ é 😀"},
			Target: Target{Host: "[::1]:443", Path: "/a\tb\x01"}, Outcome: Outcome{Error: "denied"}},
		Event{Kind: KindMCPRejected, Outcome: Outcome{Status: 400, Error: "bad_host"}})
	lines := sealedLines(t, evs)
	var d lineDecoder
	for _, line := range lines {
		want, err := ParseLine(line)
		require.NoError(t, err)
		got, err := d.decode(line)
		require.NoError(t, err, "%s", line)
		assert.Equal(t, want.Kind, got.Kind)
		assert.True(t, want.Time.Equal(got.Time))
		assert.Equal(t, want.TraceID, got.TraceID)
		assert.Equal(t, want.SpanID, got.SpanID)
		ws, wt := recordSeverity(&want)
		gs, gt := recordSeverity(&got)
		assert.Equal(t, ws, gs)
		assert.Equal(t, wt, gt)
		assert.Equal(t, appendEventAttributes(nil, &want), appendEventAttributes(nil, &got), "%s", line)
	}
}

// TestOTLPLineDecoderRejectsWhatParseLineRejects: a line that is not an event in the writer's
// form, or whose exported fields have the wrong type, is not decoded (it goes out as
// "audit.unparsed").
func TestOTLPLineDecoderRejectsWhatParseLineRejects(t *testing.T) {
	good := string(sealedLines(t, []Event{testEvent(1)})[0])
	hash := good[strings.LastIndex(good, `,"hash":`):]
	// A repeated member is read as encoding/json reads it (the last wins), but a repeated "hash"
	// is refused rather than read either way.
	var d lineDecoder
	_, err := d.decode([]byte(`{"hash":"` + strings.Repeat("0", 64) + `","id":"x"` + hash))
	assert.Error(t, err, "a second hash member")
	bad := map[string]string{
		"empty":             ``,
		"cut off":           good[:len(good)/2],
		"not an object":     `["x"` + hash[:len(hash)-1] + `]`,
		"status a string":   strings.Replace(good, `"status":200`, `"status":"200"`, 1),
		"allow a string":    strings.Replace(good, `"allow":true`, `"allow":"yes"`, 1),
		"sandbox a number":  strings.Replace(good, `"sandbox":"sb-1"`, `"sandbox":1`, 1),
		"time not a time":   strings.Replace(good, `"time":"`, `"time":"x`, 1),
		"trailing garbage":  good + `}`,
		"two objects":       good + good,
		"status fractional": strings.Replace(good, `"status":200`, `"status":200.5`, 1),
		"identity a string": strings.Replace(good, `"identity":{`, `"identity":"x","y":{`, 1),
		"outcome an array":  strings.Replace(good, `"outcome":{"status":200`, `"outcome":[200],"z":{"status":200`, 1),
	}
	for name, line := range bad {
		_, perr := ParseLine([]byte(line))
		_, derr := d.decode([]byte(line))
		assert.Error(t, perr, "%s: ParseLine", name)
		assert.Error(t, derr, "%s: the exporter's decoder", name)
	}
}
