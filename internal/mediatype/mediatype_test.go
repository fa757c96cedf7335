package mediatype

import (
	"mime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOf(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"application/json", "application/json"},
		{"text/event-stream", "text/event-stream"},
		{"application/json; charset=utf-8", "application/json"},
		{"Application/JSON", "application/json"},
		{" text/event-stream ", "text/event-stream"},
		{"text/event-stream;", "text/event-stream"},
	} {
		got, err := Of(c.in)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
	}
	for _, bad := range []string{"", "application/", "/json", "a/b/c", "text/event stream", "a/b\x00"} {
		_, err := Of(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// FuzzOf holds Of to mime.ParseMediaType: the same media type and an error exactly when it
// errs.
func FuzzOf(f *testing.F) {
	for _, s := range []string{"application/json", "text/event-stream", "application/json; charset=utf-8",
		"Text/Plain", "a/b/c", "json", "a/", "/b", "a b/c", "a/b;c=d", "a/\x7f", "a/\xff", "x-(y)/z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		want, _, wantErr := mime.ParseMediaType(v)
		got, err := Of(v)
		if (err != nil) != (wantErr != nil) || err == nil && got != want {
			t.Fatalf("Of(%q) = %q, %v; mime.ParseMediaType: %q, %v", v, got, err, want, wantErr)
		}
	})
}

func BenchmarkOf(b *testing.B) {
	for _, v := range []string{"application/json", "text/event-stream; charset=utf-8"} {
		b.Run(v, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Of(v)
			}
		})
	}
}
