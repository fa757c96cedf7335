package respguard

import (
	"io"
	"net/http"
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

// BenchmarkReader is the guard's cost for one answer with one credential's needles: the
// bench's short streamed answer read event by event, a long one of many deltas read in 32 KiB
// reads, and a non-streamed answer (JSON, read in pieces too since issue 59) in one read.
func BenchmarkReader(b *testing.B) {
	needles := Build([]string{secret}, nil)
	long := strings.Join(ssetest.LongModelAnswer("claude-bench", 2000), "")
	json := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-bench","content":[{"type":"text","text":"` +
		strings.Repeat(`Here is the change you asked for.\n\n`, 60) + `"}],"stop_reason":"end_turn","stop_sequence":null,` +
		`"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":51200,"output_tokens":503}}`
	for name, events := range map[string][]string{"short": ssetest.ModelAnswer("claude-bench"), "long": {long}, "json": {json}} {
		size := 0
		for _, e := range events {
			size += len(e)
		}
		pieces := InPieces(http.Header{"Content-Type": {map[bool]string{true: "application/json", false: "text/event-stream"}[name == "json"]}})
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			buf := make([]byte, 32<<10)
			for b.Loop() {
				r := NewReader(&eventReader{events: append([]string(nil), events...)}, needles, pieces, nil)
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}
