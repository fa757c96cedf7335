package proxy

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/respguard"
)

// chunks is a body that arrives in the given pieces, one per Read.
type chunks struct{ parts []string }

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.parts[0])
	c.parts[0] = c.parts[0][n:]
	if c.parts[0] == "" {
		c.parts = c.parts[1:]
	}
	return n, nil
}

func (c *chunks) Close() error { return nil }

func testSet(t *testing.T, values map[string]string, refs ...config.ProxyRoute) *respguard.Needles {
	t.Helper()
	return newScrubber(credential.FromValues(values), config.Proxy{Routes: refs}).Current()
}

// scrubbed is body through a scrubBody.
func scrubbed(body io.Reader, set *respguard.Needles, onHit func()) *scrubBody {
	return newScrubBody(&http.Response{Body: io.NopCloser(body), Header: http.Header{}}, set, onHit)
}

func TestScrubBody(t *testing.T) {
	const key = "sk-test-abcdefgh1234"
	set := testSet(t, map[string]string{"a": key, "short": "abc", "mid": "abcdef"},
		config.ProxyRoute{Credential: &config.CredentialRef{Name: "a", Header: "Authorization", Format: "Basic user:{value}"}})
	red := (respguard.Marker + "***")[:len(key)]
	read := func(parts []string, bufSize int) (string, bool) {
		hit := false
		b := scrubbed(&chunks{parts: parts}, set, func() { hit = true })
		var out bytes.Buffer
		_, err := io.CopyBuffer(&out, struct{ io.Reader }{b}, make([]byte, bufSize))
		require.NoError(t, err)
		return out.String(), hit
	}
	t.Run("a value split at every point, read with large and tiny buffers", func(t *testing.T) {
		for at := 0; at <= len(key); at++ {
			for _, size := range []int{1, 7, 32 << 10} {
				got, hit := read([]string{"pre " + key[:at], key[at:] + " post"}, size)
				assert.Equal(t, "pre "+red+" post", got, "split at %d, buffer %d", at, size)
				assert.True(t, hit)
			}
		}
	})
	t.Run("a prefix of a value that never completes is passed on unchanged", func(t *testing.T) {
		got, hit := read([]string{"x " + key[:10], "y"}, 32<<10)
		assert.Equal(t, "x "+key[:10]+"y", got)
		assert.False(t, hit)
	})
	t.Run("values shorter than 8 bytes are left in bodies", func(t *testing.T) {
		got, hit := read([]string{"abcdef abc"}, 64)
		assert.Equal(t, "abcdef abc", got)
		assert.False(t, hit)
	})
	t.Run("base64 of the value and of the rendered user:value, any alignment, either alphabet", func(t *testing.T) {
		for _, n := range respguard.Base64Forms(key) {
			got, hit := read([]string{"<" + n + ">"}, 64)
			assert.True(t, hit, n)
			assert.NotContains(t, got, n)
		}
		for _, n := range respguard.Base64Forms("user:" + key) {
			got, _ := read([]string{n}, 64)
			assert.NotContains(t, got, n)
		}
	})
	t.Run("only a suffix that could begin a needle is held back", func(t *testing.T) {
		b := scrubbed(&chunks{parts: []string{"data: x\n\n", "data: sk-te", "st\n\n"}}, set, func() {})
		p := make([]byte, 32<<10)
		n, err := b.Read(p)
		require.NoError(t, err)
		assert.Equal(t, "data: x\n\n", string(p[:n]), "a whole event passes at once")
		n, err = b.Read(p)
		require.NoError(t, err)
		assert.Equal(t, "data: ", string(p[:n]), "what could begin the key waits")
	})
	t.Run("headers: values of 4 bytes and more and their encodings", func(t *testing.T) {
		h := http.Header{"A": {"x abcdef"}, "B": {"abc"}, "C": {"fine"}, "D": {respguard.Base64Forms(key)[1]}}
		assert.True(t, set.ScrubHeader(h))
		assert.Equal(t, http.Header{"B": {"abc"}, "C": {"fine"}}, h)
	})
	t.Run("iotest: the scrubber is a well-behaved reader", func(t *testing.T) {
		body := strings.Repeat("lorem ipsum ", 1000) + key
		want := strings.Repeat("lorem ipsum ", 1000) + red
		require.NoError(t, iotest.TestReader(scrubbed(strings.NewReader(body), set, func() {}), []byte(want)))
	})
}

// A rotated value applies to the next response.
func TestScrubberFollowsRotation(t *testing.T) {
	file := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(file, []byte("first-value-1234"), 0o600))
	store, err := credential.NewStore([]config.Credential{{Name: "a", File: file}}, nil, nil)
	require.NoError(t, err)
	s := newScrubber(store, config.Proxy{})
	first := s.Current()
	assert.Same(t, first, s.Current(), "unchanged values reuse the needles")
	require.NoError(t, os.WriteFile(file, []byte("second-value-5678"), 0o600))
	store.Refresh()
	assert.True(t, s.Current().Betrays([]byte("second-value-5678")))
	assert.False(t, s.Current().Betrays([]byte("first-value-1234")))
}

// BenchmarkScrub is the scrubber's cost for one response: the needles for the store's values,
// the response headers, and a body of the given size read through it in 32 KiB reads.
func BenchmarkScrub(b *testing.B) {
	s := newScrubber(credential.FromValues(map[string]string{"anthropic": realKey, "openai": "sk-proj-" + strings.Repeat("x", 40)}), config.Proxy{})
	for _, size := range []int{1 << 10, 64 << 10} {
		body := []byte(strings.Repeat("data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"some streamed text\"}}\n\n", size/50+1)[:size])
		b.Run(strconv.Itoa(size>>10)+"KiB", func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			buf := make([]byte, 32<<10)
			for b.Loop() {
				set := s.Current()
				h := http.Header{"Content-Type": {"text/event-stream"}, "Request-Id": {"req_0123456789"}, "Date": {"Mon, 30 Nov 2026 15:58:16 GMT"},
					"Anthropic-Ratelimit-Requests-Remaining": {"999"}, "Cf-Ray": {"8f0a0b0c0d0e0f-AMS"}}
				set.ScrubHeader(h)
				sb := newScrubBody(&http.Response{Body: io.NopCloser(bytes.NewReader(body)), Header: h}, set, func() {})
				for {
					if _, err := sb.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}
