package respguard

import (
	"io"
	"strconv"
	"strings"
	"testing"
)

// modelStream is a short streamed model answer, as the bench's stand-in sends it: seven
// events, each read on its own (the upstream flushes per event).
var modelStream = []string{
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-bench\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \"}}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"streamed\"}}\n\n",
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
}

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
	long := modelStream[:2]
	for i := range 2000 {
		long = append(long, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"word"+strconv.Itoa(i)+" \"}}\n\n")
	}
	long = append(long, modelStream[4:]...)
	for name, events := range map[string][]string{"short": modelStream, "long": {strings.Join(long, "")}} {
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
