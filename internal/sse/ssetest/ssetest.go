// Package ssetest holds the event streams that the bench's model-API stand-in sends and that
// the parsers' benchmarks read, so that a micro-benchmark measures the stream sandbench does.
package ssetest

import "strconv"

// ModelAnswer is a short streamed Messages answer from model, one string per event: what the
// bench's stand-in sends (and flushes) for "stream": true.
func ModelAnswer(model string) []string {
	return []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":" + strconv.Quote(model) + ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"streamed\"}}\n\n",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	}
}

// LongModelAnswer is ModelAnswer with n text deltas in place of its two.
func LongModelAnswer(model string, n int) []string {
	short := ModelAnswer(model)
	long := append([]string(nil), short[:2]...)
	for i := range n {
		long = append(long, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"word"+strconv.Itoa(i)+" \"}}\n\n")
	}
	return append(long, short[4:]...)
}
