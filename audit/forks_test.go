package audit

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openUnlocked opens a sink on a folder without taking it: what a second process did before
// the folder was locked, and what a lock file removed under a running sink still allows.
func openUnlocked(t testing.TB, cfg FileConfig) *FileSink {
	t.Helper()
	s, err := openLocked(cfg.withDefaults(), nil)
	require.NoError(t, err)
	return s
}

// forkedLog writes what two processes write into one folder at once: writer 0 (the folder's
// holder) records before events, then each of the others opens the folder as it is (reading its
// last hash), writer 0 records lead more, and then all of them record in turn, rounds times.
func forkedLog(t testing.TB, dir string, writers, before, lead, rounds int, opts ...Option) {
	t.Helper()
	opts = append([]Option{WithDelivery(DeliveryBlocking)}, opts...)
	sink, err := OpenFileSink(FileConfig{Dir: dir})
	require.NoError(t, err)
	ws := []*Writer{NewWriter(sink, opts...)}
	i := 0
	record := func(w *Writer) {
		ev := testEvent(i)
		i++
		require.NoError(t, w.Record(&ev))
	}
	for range before {
		record(ws[0])
	}
	for range writers - 1 {
		ws = append(ws, NewWriter(openUnlocked(t, FileConfig{Dir: dir}), opts...))
	}
	for range lead {
		record(ws[0])
	}
	for range rounds {
		for _, w := range ws {
			record(w)
		}
	}
	for _, w := range ws {
		require.NoError(t, w.Close(context.Background()))
	}
}

// TestVerifySaysTwoWriters: a log two (or three) processes appended to at once is reported as
// such, not as edited or reordered, each chain verified on its own with its keys and
// checkpoints; it still fails verification. Copies, removals and edits stay what they were.
func TestVerifySaysTwoWriters(t *testing.T) {
	keyed := []Option{WithChainKey(testChainKey), WithCheckpoints(CheckpointConfig{Key: testSignKey, EveryEvents: 5, Every: time.Hour})}
	withKeys := VerifyOptions{ChainKey: testChainKey, PublicKey: testPublicKey}
	for _, tc := range []struct {
		name                   string
		writers, before, lead  int
		opts                   []Option
		vo                     VerifyOptions
		tamper                 func(t *testing.T, path string)
		wantTwo                bool
		wantBreak, wantEvents  string
		wantBreakInSecondChain bool
	}{
		{name: "two plain chains, interleaved line by line", writers: 2, before: 3, wantTwo: true},
		{name: "two keyed chains with signed checkpoints", writers: 2, before: 3, opts: keyed, vo: withKeys, wantTwo: true},
		{name: "a second writer whose first line links far back", writers: 2, before: 3, lead: 400, wantTwo: true},
		{name: "three writers", writers: 3, before: 2, opts: keyed, vo: withKeys, wantTwo: true},
		{name: "a second writer on an empty log", writers: 2, wantTwo: true},
		{
			name: "an edit in the second writer's chain is still found", writers: 2, before: 3, wantTwo: true,
			tamper: func(t *testing.T, path string) {
				lines := readLines(t, path)
				last := len(lines) - 1 // the second writer's last event
				lines[last] = bytes.Replace(lines[last], []byte(`"allow":true`), []byte(`"allow":false`), 1)
				writeLines(t, path, lines)
			},
			wantBreak: "edited",
		},
		{
			name: "a line repeated in a one-writer log is a break, not a second writer", writers: 1, before: 6,
			tamper: func(t *testing.T, path string) {
				lines := readLines(t, path)
				lines = append(lines[:4], append([][]byte{lines[3]}, lines[4:]...)...)
				writeLines(t, path, lines)
			},
			wantBreak: "reordered",
		},
		{
			name: "a line removed from a one-writer log is a missing line, not a second writer", writers: 1, before: 6,
			tamper: func(t *testing.T, path string) {
				removeLine(t, path, 3)
			},
			wantBreak: "missing",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			const rounds = 12
			forkedLog(t, dir, tc.writers, tc.before, tc.lead, rounds, tc.opts...)
			if tc.tamper != nil {
				tc.tamper(t, filepath.Join(dir, ActiveFile))
			}
			r, err := VerifyWith(dir, tc.vo)
			require.NoError(t, err)
			assert.False(t, r.OK(), "%s", r)
			if tc.wantTwo {
				require.NotNil(t, r.TwoWriters, "%s", r)
				assert.Contains(t, r.String(), "two writers")
				assert.NotContains(t, r.TwoWriters.String(), "edited")
			} else {
				assert.Nil(t, r.TwoWriters, "%s", r)
				assert.NotContains(t, r.String(), "two writers")
			}
			if tc.wantBreak == "" {
				assert.Nil(t, r.Break, "each chain verifies on its own: %s", r)
				assert.Equal(t, tc.before+tc.lead+tc.writers*rounds, r.Events, "every event of every writer was verified")
			} else {
				require.NotNil(t, r.Break, "%s", r)
				assert.Contains(t, r.Break.Reason, tc.wantBreak)
			}
		})
	}
}

// TestASinkDoesNotContinueAForkedLog: a restart on a log that two processes wrote at once
// refuses to continue it, and says what happened and what to do, wherever the fork is in the
// files a restart continues from; a one-writer log, even a tampered one, opens as before (its
// breaks are Verify's to report).
func TestASinkDoesNotContinueAForkedLog(t *testing.T) {
	for _, tc := range []struct {
		name     string
		build    func(t *testing.T, dir string)
		wantFork bool
	}{
		{"two writers in audit.log", func(t *testing.T, dir string) {
			forkedLog(t, dir, 2, 3, 0, 4)
		}, true},
		{"two writers in the rotated file before an empty audit.log", func(t *testing.T, dir string) {
			forkedLog(t, dir, 2, 3, 0, 4)
			rotateNow(t, dir)
		}, true},
		{"two writers that both rotated: audit.log continues a line of the rotated file that is not its last", func(t *testing.T, dir string) {
			forkedLog(t, dir, 2, 3, 0, 6)
			lines := readLines(t, filepath.Join(dir, ActiveFile))
			// The first writer rotated after line 7 and went on in a new audit.log; the second
			// went on in the rotated file, whose descriptor it held (lines alternate from line
			// 4: the first writer's, the second's).
			const k = 7
			rotated, active := append([][]byte{}, lines[:k]...), [][]byte{}
			for i := k; i < len(lines); i++ {
				if (i-3)%2 == 0 {
					active = append(active, lines[i])
				} else {
					rotated = append(rotated, lines[i])
				}
			}
			writeLines(t, filepath.Join(dir, rotatedName(time.Now())), rotated)
			writeLines(t, filepath.Join(dir, ActiveFile), active)
			f, err := forkIn([]string{filepath.Join(dir, ActiveFile)})
			require.NoError(t, err)
			require.Nil(t, f, "audit.log alone holds one chain")
		}, true},
		{"one writer, across rotations", func(t *testing.T, dir string) {
			writeLog(t, FileConfig{Dir: dir, MaxSize: 3000}, 20, WithMaxBatch(1))
		}, false},
		{"one writer, a line removed", func(t *testing.T, dir string) {
			writeLog(t, FileConfig{Dir: dir}, 8)
			removeLine(t, filepath.Join(dir, ActiveFile), 4)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.build(t, dir)
			s, err := OpenFileSink(FileConfig{Dir: dir})
			if !tc.wantFork {
				require.NoError(t, err)
				require.NoError(t, s.Close())
				return
			}
			var forked *ForkedLogError
			require.ErrorAs(t, err, &forked)
			assert.Contains(t, err.Error(), "two processes")
			assert.Contains(t, err.Error(), "two writers")
			assert.Contains(t, err.Error(), "sandgate audit verify --dir "+dir)
			// Refused, it changed nothing and holds nothing: the folder can be taken again.
			again, err := lockFolder(dir)
			require.NoError(t, err)
			again.release()
		})
	}
}

// rotateNow renames audit.log as a rotation does and leaves an empty one.
func rotateNow(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.Rename(filepath.Join(dir, ActiveFile), filepath.Join(dir, rotatedName(time.Now()))))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ActiveFile), nil, 0o600))
}

// FuzzForkIn: any content of a log file, forked or not, is read by the restart's check and by
// Verify without a panic, and a fork the check finds is one Verify reports too (or a break
// before it).
func FuzzForkIn(f *testing.F) {
	dir := f.TempDir()
	forkedLog(f, dir, 2, 2, 1, 3)
	seed, err := os.ReadFile(filepath.Join(dir, ActiveFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte("{}\n{\"prev_hash\":\"\",\"hash\":\"\"}\n"))
	logDir := f.TempDir() // one per fuzzing process, whose inputs run one after another
	f.Fuzz(func(t *testing.T, log []byte) {
		dir := logDir
		path := filepath.Join(dir, ActiveFile)
		if err := os.WriteFile(path, log, 0o600); err != nil {
			t.Fatal(err)
		}
		fork, err := forkIn([]string{path})
		if err != nil {
			t.Fatal(err)
		}
		r, err := Verify(dir)
		if err != nil {
			return // a keyed log: Verify needs its key
		}
		if fork != nil && r.TwoWriters == nil && r.Break == nil {
			t.Fatalf("the restart's check found two writers at %s, Verify nothing: %s", fork, r)
		}
	})
}
