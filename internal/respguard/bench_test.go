package respguard

import (
	"io"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/sse/ssetest"
)

// eventReader returns one event per Read.
type eventReader struct{ events []string }

func (e *eventReader) Read(p []byte) (int, error) {
	if len(e.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, e.events[0])
	if e.events[0] = e.events[0][n:]; e.events[0] == "" {
		e.events = e.events[1:]
	}
	return n, nil
}

// BenchmarkReader is the guard's cost for one streamed answer with one credential's needles:
// the bench's short answer read event by event, and a long answer of many deltas read in 32
// KiB reads.
func BenchmarkReader(b *testing.B) {
	needles := Build([]string{secret}, nil)
	long := strings.Join(ssetest.LongModelAnswer("claude-bench", 2000), "")
	for name, events := range map[string][]string{"short": ssetest.ModelAnswer("claude-bench"), "long": {long}} {
		size := 0
		for _, e := range events {
			size += len(e)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			buf := make([]byte, 32<<10)
			for b.Loop() {
				r := NewReader(&eventReader{events: append([]string(nil), events...)}, needles, true, nil)
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}
