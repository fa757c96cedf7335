package jsonscan

import "testing"

// toolCall is a typical tools/call message.
var toolCall = []byte(`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"create_pull_request",` +
	`"arguments":{"owner":"acme","repo":"api","title":"Fix the flaky test","head":"fix/flaky","base":"main",` +
	`"body":"The test waited on a sleep; it now polls with a deadline.\n\nCloses #12.","draft":false,"labels":["ci","tests"]},` +
	`"_meta":{"progressToken":7}}}`)

// BenchmarkUnambiguous compares the one-reading check with the plain validating scan of the
// same message (Members, which every message already gets).
func BenchmarkUnambiguous(b *testing.B) {
	b.Run("members", func(b *testing.B) {
		b.SetBytes(int64(len(toolCall)))
		for b.Loop() {
			if err := Members(toolCall, func([]byte, bool, []byte) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unambiguous", func(b *testing.B) {
		b.SetBytes(int64(len(toolCall)))
		for b.Loop() {
			if err := Unambiguous(toolCall); err != nil {
				b.Fatal(err)
			}
		}
	})
}
