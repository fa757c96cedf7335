package respguard_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

const secret = "sk-ant-REAL-0123456789abcdef"

func TestDecodeEveryCodingAndStacks(t *testing.T) {
	body := []byte(`{"echo":"` + secret + `"}`)
	for _, stack := range [][]string{{"gzip"}, {"x-gzip"}, {"deflate"}, {"deflate-raw"}, {"br"}, {"zstd"},
		{"gzip", "br"}, {"zstd", "deflate", "gzip"}, {"br", "br"}, {"identity", "gzip"}} {
		t.Run(strings.Join(stack, ","), func(t *testing.T) {
			enc, header := respguardtest.Encode(body, stack...)
			resp := &http.Response{Header: http.Header{"Content-Encoding": {header}, "Content-Length": {"1"}},
				Body: io.NopCloser(bytes.NewReader(enc)), ContentLength: 1}
			require.NoError(t, respguard.Decode(resp))
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, body, got)
			assert.Empty(t, resp.Header.Get("Content-Encoding"))
			assert.Empty(t, resp.Header.Get("Content-Length"))
			assert.EqualValues(t, -1, resp.ContentLength)
		})
	}
}

func TestDecodeRefusesUnknownCodings(t *testing.T) {
	for _, ce := range []string{"compress", "gzip, snappy", "aes128gcm", "exi"} {
		resp := &http.Response{Header: http.Header{"Content-Encoding": {ce}}, Body: io.NopCloser(strings.NewReader("x"))}
		assert.ErrorIs(t, respguard.Decode(resp), respguard.ErrEncoding, ce)
	}
}

// TestDecodeRefusesADeepStack: every layer of a stack is a decoder with its own window, so a
// header listing thousands of codings would cost gigabytes; more than MaxCodings is refused
// before any decoder is made, however well formed the body.
func TestDecodeRefusesADeepStack(t *testing.T) {
	body := []byte(`{"echo":"` + secret + `"}`)
	for _, depth := range []int{respguard.MaxCodings + 1, 100} {
		stack := make([]string, depth)
		for i := range stack {
			stack[i] = []string{"gzip", "br", "zstd", "deflate"}[i%4]
		}
		enc, header := respguardtest.Encode(body, stack...)
		resp := &http.Response{Header: http.Header{"Content-Encoding": {header}}, Body: io.NopCloser(bytes.NewReader(enc))}
		err := respguard.Decode(resp)
		require.ErrorIs(t, err, respguard.ErrEncoding, "depth %d", depth)
		assert.Contains(t, err.Error(), fmt.Sprintf("a stack of more than %d codings", respguard.MaxCodings))
		assert.Equal(t, header, resp.Header.Get("Content-Encoding"), "refused as it came")
	}
	huge := strings.Repeat("gzip, ", 200_000) + "gzip" // a megabyte of header
	resp := &http.Response{Header: http.Header{"Content-Encoding": {huge}}, Body: io.NopCloser(strings.NewReader("x"))}
	allocs := testing.AllocsPerRun(10, func() {
		assert.ErrorIs(t, respguard.Decode(resp), respguard.ErrEncoding)
	})
	assert.Less(t, allocs, 20.0, "the list is not split whole")

	enc, header := respguardtest.Encode(body, "gzip", "br", "zstd", "deflate")
	resp = &http.Response{Header: http.Header{"Content-Encoding": {header}}, Body: io.NopCloser(bytes.NewReader(enc))}
	require.NoError(t, respguard.Decode(resp), "a stack of MaxCodings is decoded")
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, body, got)
}

func TestDecodeBombIsRefusedWhileRead(t *testing.T) {
	enc, header := respguardtest.Encode(bytes.Repeat([]byte{0}, 64<<20), "gzip", "gzip")
	resp := &http.Response{Header: http.Header{"Content-Encoding": {header}}, Body: io.NopCloser(bytes.NewReader(enc))}
	require.NoError(t, respguard.Decode(resp))
	n, err := io.Copy(io.Discard, resp.Body)
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
	assert.Less(t, n, int64(64<<20), "refused before the end")
}

func TestLimit(t *testing.T) {
	b := respguard.Limit(io.NopCloser(strings.NewReader(strings.Repeat("x", 100))), 10, "body")
	_, err := io.ReadAll(b)
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
	b = respguard.Limit(io.NopCloser(strings.NewReader(strings.Repeat("x", 10))), 10, "body")
	got, err := io.ReadAll(b)
	assert.NoError(t, err)
	assert.Len(t, got, 10)
}
