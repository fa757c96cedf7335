package sse

import (
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/sse/ssetest"
)

// BenchmarkParser is one streamed model answer fed as it arrives, one event a Feed: the
// bench's seven events, and an answer of 2000 deltas.
func BenchmarkParser(b *testing.B) {
	short, long := ssetest.ModelAnswer("claude-bench"), ssetest.LongModelAnswer("claude-bench", 2000)
	for name, events := range map[string][]string{"short": short, "long": long} {
		chunks := make([][]byte, len(events))
		for i, e := range events {
			chunks[i] = []byte(e)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(strings.Join(events, ""))))
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				ps := Parser{Max: 1 << 20, SkipOversized: true}
				for _, c := range chunks {
					_, _ = ps.Feed(c, func(ev Event) bool { n += len(ev.Data); return true })
				}
			}
		})
	}
}
