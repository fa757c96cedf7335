package sse

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkParser is one streamed model answer fed as it arrives, one event a Feed: the
// bench's seven events, and an answer of 2000 deltas.
func BenchmarkParser(b *testing.B) {
	short := []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-bench\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"streamed\"}}\n\n",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	}
	long := short[:2]
	for i := range 2000 {
		long = append(long, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"word"+strconv.Itoa(i)+" \"}}\n\n")
	}
	long = append(long, short[4:]...)
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
