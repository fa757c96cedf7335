package policy

import (
	"testing"
	"time"
)

// BenchmarkEventEncoder is the writer's work per decision for BenchmarkCallDecision's tools/call,
// against the generic path it replaced (referenceEvent).
func BenchmarkEventEncoder(b *testing.B) {
	item := &loggedDecision{id: "0190b7a0-0000-7000-8000-000000000001", path: DecisionPath, at: time.Now(),
		in: mcpCall(map[string]any{"q": "func main", "page": 7}), d: Decision{Allow: true, Reason: "ok", Code: "allow", Revision: "r"}}
	masks := parseMasks(b, DefaultMask)
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		e := newEventEncoder(masks, map[string]string{"id": "r1"})
		var buf []byte
		for b.Loop() {
			buf = e.encode(buf[:0], item)
		}
	})
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = referenceEvent(b, masks, map[string]string{"id": "r1"}, item)
		}
	})
}
