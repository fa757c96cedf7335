package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTornTailIsHealedAtStart: a log whose end was torn by a crash (a partial last line, zero
// bytes, garbage) opens: the tail is kept in audit.log.torn-*, the chain continues from the last
// whole line, an audit.recovered record says what was cut, and Verify passes reporting the
// recovery, with a plain chain and with a keyed chain and signed checkpoints (the published ones
// included). Before, serve refused to start on such a log until someone edited it.
func TestTornTailIsHealedAtStart(t *testing.T) {
	tears := []struct {
		name       string
		tear       func(b []byte) []byte
		reason     string
		eventsKept int
	}{
		{"partial last line", func(b []byte) []byte { return b[:len(b)-20] }, "partial line", 2},
		{"zero bytes after the last line", func(b []byte) []byte { return append(b, make([]byte, 4096)...) }, "zero bytes", 3},
		{"partial line then zero bytes", func(b []byte) []byte { return append(b[:len(b)-20], make([]byte, 512)...) }, "garbage", 2},
		{"garbage lines", func(b []byte) []byte { return append(b, "\x17\x03garbage\n{\"not\": \"ours\"}\nxyz"...) }, "garbage", 3},
	}
	modes := []struct {
		name string
		opts func(pub *published) []Option
		vo   func(pub *published) VerifyOptions
	}{
		{"plain", func(*published) []Option { return nil }, func(*published) VerifyOptions { return VerifyOptions{} }},
		{"keyed and signed", func(pub *published) []Option {
			return append(checkpointOpts(2, newFakeClock(), pub), WithChainKey(testChainKey))
		}, func(pub *published) VerifyOptions {
			return VerifyOptions{ChainKey: testChainKey, PublicKey: testPublicKey, External: pub.list}
		}},
		// A blocking writer's Records write the log themselves (commit.go): the recovery
		// record must still come first.
		{"keyed and signed, blocking", func(pub *published) []Option {
			return append(checkpointOpts(2, newFakeClock(), pub), WithChainKey(testChainKey), WithDelivery(DeliveryBlocking))
		}, func(pub *published) VerifyOptions {
			return VerifyOptions{ChainKey: testChainKey, PublicKey: testPublicKey, External: pub.list}
		}},
	}
	for _, m := range modes {
		for _, tc := range tears {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				var pub published
				cfg := FileConfig{Dir: dir}
				writeLog(t, cfg, 3, m.opts(&pub)...)
				path := filepath.Join(dir, ActiveFile)
				b, err := os.ReadFile(path)
				require.NoError(t, err)
				// Records of the writer (chain marker, checkpoints) close the log; a tear cuts into
				// the last line whatever it is. Keep only up to the third event plus the tear.
				torn := tc.tear(b)
				require.NoError(t, os.WriteFile(path, torn, 0o600))

				w := openWriter(t, cfg, m.opts(&pub)...)
				for i := 10; i < 12; i++ {
					ev := testEvent(i)
					require.NoError(t, w.Record(&ev))
				}
				require.NoError(t, closeWriter(w))

				report, err := VerifyWith(dir, m.vo(&pub))
				require.NoError(t, err)
				require.True(t, report.Complete(), "%s", report)
				require.Len(t, report.Recoveries, 1, "%s", report)
				rc := report.Recoveries[0]
				assert.Equal(t, tc.reason, rc.Reason)
				kept, err := os.ReadFile(filepath.Join(dir, rc.File))
				require.NoError(t, err, "the cut part is kept beside the log")
				sum := sha256.Sum256(kept)
				assert.Equal(t, hex.EncodeToString(sum[:]), rc.SHA256)
				assert.Equal(t, rc.Bytes, int64(len(kept)))
				assert.True(t, bytes.HasPrefix(torn, torn[:rc.Offset]) && bytes.Equal(torn[rc.Offset:], kept), "exactly the tail was cut")
				assert.Contains(t, report.String(), "recovered: ")

				res, err := Query(t.Context(), dir, Filter{Limit: -1})
				require.NoError(t, err)
				var traces []string
				for _, ev := range res.Events {
					traces = append(traces, ev.TraceID)
				}
				want := []string{"t0", "t1", "t2"}[:min(tc.eventsKept, 3)]
				if m.name != "plain" {
					want = []string{"t0", "t1", "t2"} // the cut line was the closing checkpoint, not an event
				}
				assert.Equal(t, append(want, "t10", "t11"), traces)
			})
		}
	}
}

func closeWriter(w *Writer) error { return w.Close(context.Background()) }

// TestLongRunWithoutAWholeLineIsNotHealed: more than a torn write (a file that is garbage
// throughout its last 16 MiB and more) is left for a person to look at.
func TestLongRunWithoutAWholeLineIsNotHealed(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 1)
	path := filepath.Join(dir, ActiveFile)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(strings.Repeat("x", maxTornTail+maxLineSize+1))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = OpenFileSink(FileConfig{Dir: dir})
	require.ErrorContains(t, err, "no whole audit line")
	require.ErrorContains(t, err, "sandgate audit verify")
}

// TestWholeLogNeedsNoHealing: a log that ends with a whole line is left as it is.
func TestWholeLogNeedsNoHealing(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir}, 2)
	s, err := OpenFileSink(FileConfig{Dir: dir})
	require.NoError(t, err)
	assert.Nil(t, s.Recovered())
	require.NoError(t, s.Close())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		assert.False(t, strings.HasPrefix(e.Name(), tornPrefix), e.Name())
	}
}

// TestVerifyNamesAHealedTailBeforeACheckpointItNoLongerReaches: a host crash loses the lines not
// yet on disk, which a checkpoint kept outside the log (the process log's copy) still counts.
// The log heals at start; verify with that copy breaks, as it must, and says that the torn tail
// cut there may be the cause, not only a rewrite.
func TestVerifyNamesAHealedTailBeforeACheckpointItNoLongerReaches(t *testing.T) {
	dir := t.TempDir()
	var first published
	cfg := FileConfig{Dir: dir}
	// ev0, checkpoint (1), ev1, ev2, checkpoint (4), ev3, ev4, checkpoint (7).
	writeLog(t, cfg, 5, checkpointOpts(2, newFakeClock(), &first)...)
	path := filepath.Join(dir, ActiveFile)
	lines := readLines(t, path)
	require.Len(t, lines, 8)
	// What reached the disk: the first 5 lines and half of the sixth.
	var kept []byte
	for _, l := range lines[:5] {
		kept = append(append(kept, l...), '\n')
	}
	kept = append(kept, lines[5][:len(lines[5])/2]...)
	require.NoError(t, os.WriteFile(path, kept, 0o600))

	var second published
	writeLog(t, cfg, 1, checkpointOpts(2, newFakeClock(), &second)...)
	report, err := VerifyWith(dir, VerifyOptions{PublicKey: testPublicKey, External: first.list})
	require.NoError(t, err)
	require.NotNil(t, report.Break, "%s", report)
	assert.Contains(t, report.Break.Reason, "external checkpoint 3")
	assert.Contains(t, report.Break.Reason, "or lost in a host crash: a torn tail was cut at "+path+":6")
	assert.Contains(t, report.String(), "recovered: ")

	report, err = VerifyWith(dir, VerifyOptions{PublicKey: testPublicKey, External: first.list[:2]})
	require.NoError(t, err)
	assert.True(t, report.Complete(), "the checkpoints before the cut still hold: %s", report)
}
