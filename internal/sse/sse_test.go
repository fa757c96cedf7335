package sse

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// feedAll feeds stream to a parser in pieces of size n and returns the events as the
// reference shapes them.
func feedAll(t testing.TB, stream []byte, n int) []refEvent {
	var ps Parser
	var out []refEvent
	for off := 0; off < len(stream); off += n {
		end := min(off+n, len(stream))
		_, err := ps.Feed(stream[off:end], func(e Event) bool {
			out = append(out, refEvent{Type: e.Type, Data: string(e.Data), ID: e.ID, Retry: e.Retry})
			return true
		})
		require.NoError(t, err)
	}
	return out
}

func TestParserFollowsTheStandard(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   []refEvent
	}{
		{"LF lines", "data: a\n\n", []refEvent{{Data: "a", Retry: -1}}},
		{"CRLF lines", "event: x\r\ndata: a\r\n\r\n", []refEvent{{Type: "x", Data: "a", Retry: -1}}},
		{"CR lines", "data: a\rdata: b\r\r", []refEvent{{Data: "a\nb", Retry: -1}}},
		{"leading byte order mark is ignored", "\xef\xbb\xbfdata: a\n\n", []refEvent{{Data: "a", Retry: -1}}},
		{"a second byte order mark is data of the field name", "\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n", nil},
		{"only one space is dropped", "data:  a\n\n", []refEvent{{Data: " a", Retry: -1}}},
		{"no space", "data:a\n\n", []refEvent{{Data: "a", Retry: -1}}},
		{"comment", ": hi\ndata: a\n\n", []refEvent{{Data: "a", Retry: -1}}},
		{"field without colon", "data\ndata\n\n", []refEvent{{Data: "\n", Retry: -1}}},
		{"no data, no event", "event: x\n\n", nil},
		{"id carries over", "id: 7\ndata: a\n\ndata: b\n\n", []refEvent{{Data: "a", ID: "7", Retry: -1}, {Data: "b", ID: "7", Retry: -1}}},
		{"id with NUL is ignored", "id: 1\x002\ndata: a\n\n", []refEvent{{Data: "a", Retry: -1}}},
		{"retry digits only", "retry: 10x\ndata: a\n\nretry: 25\ndata: b\n\n", []refEvent{{Data: "a", Retry: -1}, {Data: "b", Retry: 25}}},
		{"unterminated event is not dispatched", "data: a\n\ndata: b\n", []refEvent{{Data: "a", Retry: -1}}},
		{"unknown field ignored", "foo: bar\ndata: a\n\n", []refEvent{{Data: "a", Retry: -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, reference([]byte(tt.stream)), "reference")
			for _, n := range []int{1, 2, 3, len(tt.stream)} {
				assert.Equal(t, tt.want, feedAll(t, []byte(tt.stream), n), "pieces of %d", n)
			}
		})
	}
}

func TestParserBound(t *testing.T) {
	stream := []byte("data: " + strings.Repeat("x", 100) + "\n\ndata: ok\n\n")
	ps := Parser{Max: 50}
	_, err := ps.Feed(stream, func(Event) bool { return true })
	assert.ErrorIs(t, err, ErrTooLarge)

	ps = Parser{Max: 50, SkipOversized: true}
	var got []string
	_, err = ps.Feed(stream, func(e Event) bool { got = append(got, string(e.Data)); return true })
	require.NoError(t, err)
	assert.Equal(t, []string{"ok"}, got, "the oversized event is dropped, the next one read")
	assert.Equal(t, 1, ps.Skipped)
}

func TestParserStopsAfterAnEvent(t *testing.T) {
	stream := []byte("data: a\r\n\r\ndata: b\n\n")
	var ps Parser
	n, err := ps.Feed(stream, func(Event) bool { return false })
	require.NoError(t, err)
	assert.Equal(t, "data: a\r\n\r", string(stream[:n]), "stopped right after the dispatching terminator")
	assert.False(t, ps.Pending())
}

func TestReader(t *testing.T) {
	stream := "data: a\n\nevent: e\ndata: b\ndata: c\n\ndata: cut"
	rd := NewReader(iotest.OneByteReader(strings.NewReader(stream)), 0)
	var got []string
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		got = append(got, ev.Type+"="+string(ev.Data))
	}
	assert.Equal(t, []string{"=a", "e=b\nc"}, got)

	rd = NewReader(strings.NewReader("data: "+strings.Repeat("y", 64)+"\n\n"), 32)
	_, err := rd.Next()
	assert.True(t, errors.Is(err, ErrTooLarge))
}

// FuzzParser compares Parser, fed the stream in pieces, with the standard's algorithm.
func FuzzParser(f *testing.F) {
	for _, s := range []string{"data: a\n\n", "\xef\xbb\xbfevent: x\r\ndata: 1\r\rid: 3\nretry: 12\n\n", ": c\rdata\n\n",
		"data:\xff\xfe\n\n", "\xef\xbbdata: a\n\n", "id: \x00\ndata: z\r\n\r\n"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, piece uint8) {
		want := reference(stream)
		got := feedAll(t, stream, int(piece%16)+1)
		// The parser passes bytes as they are; the reference decodes UTF-8 first.
		for i := range got {
			got[i].Type, got[i].Data, got[i].ID = decoded(got[i].Type), decoded(got[i].Data), decoded(got[i].ID)
		}
		if len(want) == 0 {
			want = nil
		}
		if !equalEvents(want, got) {
			t.Fatalf("stream %q:\nwant %+v\ngot  %+v", stream, want, got)
		}
	})
}

// decoded is s as the UTF-8 decode of the reference sees it.
func decoded(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}

func equalEvents(a, b []refEvent) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
