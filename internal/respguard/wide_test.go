package respguard

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// runTokens are minted tokens of as many runs as make a wide set with the static secret.
func runTokens(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("ory_at_%043d.%043x", i*7919, i*104729))
	}
	return out
}

// wideAndNarrow are one set of many needles searched both ways: the wide one Build makes, and
// the same set searched needle by needle.
func wideAndNarrow(t testing.TB) (wideSet, narrow *Needles) {
	vals := append([]string{secret}, runTokens(8)...)
	wideSet = Build(vals, []string{"Bearer " + vals[3]})
	require.NotNil(t, wideSet.wide, "%d needles make a wide set", len(wideSet.body))
	narrow = build(vals, []string{"Bearer " + vals[3]}, math.MaxInt)
	require.Nil(t, narrow.wide)
	return wideSet, narrow
}

// FuzzWideFindsWhatNarrowFinds: a wide set scrubs every input read in any pieces, as a body or
// an event stream, to the same bytes with the same number of hits as the search of each needle
// in turn; and holds back the same tails.
func FuzzWideFindsWhatNarrowFinds(f *testing.F) {
	wideSet, _ := wideAndNarrow(f)
	for _, nd := range wideSet.body {
		s := string(nd)
		f.Add([]byte(`{"a":"`+s+`","b":"`+s[:9]+`"}`), uint8(5))
		f.Add([]byte(`data: {"text":"`+s[:10]+`"}`+"\n\n"+`data: {"text":"`+s[10:]+`"}`+"\n\n"), uint8(0x87))
		f.Add([]byte(s+s[3:]+s), uint8(3))
	}
	tok := runTokens(8)[5]
	b64 := base64.StdEncoding.EncodeToString([]byte("0123456789" + tok + "tail"))
	f.Add([]byte(b64[:40]+"\r\n"+b64[40:]), uint8(11))
	f.Add([]byte(`{"t":"`+jsonU(tok)+`","u":"`+percent(tok)+`"}`), uint8(0x90))
	f.Fuzz(func(t *testing.T, body []byte, piece uint8) {
		wideSet, narrow := wideAndNarrow(t)
		read := func(n *Needles) (string, int) {
			r := NewReader(&chunked{s: string(body), n: int(piece%32) + 1}, n, piece >= 0x80, nil)
			out, err := io.ReadAll(r)
			require.NoError(t, err)
			return string(out), r.Hits()
		}
		wOut, wHits := read(wideSet)
		nOut, nHits := read(narrow)
		if wOut != nOut || wHits != nHits {
			t.Fatalf("%q (pieces of %d, stream %t): wide %q (%d hits), narrow %q (%d hits)", body, piece%32+1, piece >= 0x80, wOut, wHits, nOut, nHits)
		}
		if got, want := wideSet.held(body), narrow.held(body); got != want {
			t.Fatalf("held(%q): wide %d, narrow %d", body, got, want)
		}
		if got, want := wideSet.held(body), heldByDefinition(wideSet, body); got != want {
			t.Fatalf("held(%q): wide %d, by definition %d", body, got, want)
		}
	})
}

// TestWideSetScrubsEveryForm: every form the guard reads, of a run's token in a set of many,
// is gone from what a sandbox reads, read whole and a byte at a time; a header holding it is
// removed.
func TestWideSetScrubsEveryForm(t *testing.T) {
	wideSet, _ := wideAndNarrow(t)
	for _, tok := range []string{runTokens(8)[0], runTokens(8)[7], secret} {
		for _, form := range Forms(tok) {
			for _, body := range []string{"x " + form + " y", `{"text":"` + form[:len(form)/2] + `"}` + "\n\n" + `{"text":"` + form[len(form)/2:] + `"}`} {
				for _, n := range []int{1, 1 << 20} {
					r := NewReader(&chunked{s: body, n: n}, wideSet, true, nil)
					out, err := io.ReadAll(r)
					require.NoError(t, err)
					require.Len(t, out, len(body))
					require.NotContains(t, string(out), form)
					require.False(t, wideSet.Betrays(out), "%q left a credential", out)
					require.Positive(t, r.Hits())
				}
			}
		}
		h := map[string][]string{"X-Echo": {"key=" + tok}, "X-Ok": {"fine"}}
		require.True(t, wideSet.ScrubHeader(h))
		require.Equal(t, map[string][]string{"X-Ok": {"fine"}}, h)
	}
	s, hit := wideSet.ScrubString("nothing " + strings.Repeat("here ", 40))
	require.False(t, hit)
	require.Equal(t, "nothing "+strings.Repeat("here ", 40), s)
}

// FuzzIndexIsBytesIndex: a narrow set's search of each needle (index) finds what bytes.Index
// finds, in texts that hold a needle, its first bytes over and over, or anything.
func FuzzIndexIsBytesIndex(f *testing.F) {
	_, narrow := wideAndNarrow(f)
	for _, nd := range narrow.body {
		s := string(nd)
		f.Add([]byte("x " + s + " y"))
		f.Add([]byte(strings.Repeat(s[:2], 200) + s))
		f.Add([]byte(strings.Repeat(s[:1], 300) + s[:len(s)-1]))
		f.Add([]byte(strings.Repeat(s[:len(s)-1]+"!", 20) + s))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		for x, nd := range narrow.body {
			for _, from := range []int{0, len(text) / 3} {
				if got, want := narrow.index(text[from:], x), bytes.Index(text[from:], nd); got != want {
					t.Fatalf("needle %d (%q) in %q: index %d, bytes.Index %d", x, nd, text[from:], got, want)
				}
			}
		}
	})
}
