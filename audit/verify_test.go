package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lastFile stands for audit.log in the tamper table (the last file in chain order).
const lastFile = -1

func TestVerifyFindsTheFirstBreak(t *testing.T) {
	const events = 24
	tests := []struct {
		name string
		// tamper changes the log; files are in chain order.
		tamper func(t *testing.T, files []string)
		// wantFile indexes the original files (lastFile for audit.log); wantLine is 1-based.
		// wantLine 0 means the log verifies.
		wantFile, wantLine int
		wantReason         string
		wantEvents         int
	}{
		{
			name:       "an untouched log verifies",
			tamper:     func(*testing.T, []string) {},
			wantEvents: events,
		},
		{
			name: "one edited field is found on its line",
			tamper: func(t *testing.T, files []string) {
				editLine(t, files[1], 2, func(l []byte) []byte {
					return bytes.Replace(l, []byte(`"allow":true`), []byte(`"allow":false`), 1)
				})
			},
			wantFile: 1, wantLine: 2, wantReason: "edited",
		},
		{
			name: "a removed line is found on the line after it",
			tamper: func(t *testing.T, files []string) {
				removeLine(t, files[1], 2)
			},
			wantFile: 1, wantLine: 2, wantReason: "missing",
		},
		{
			name: "two swapped lines are found at the first of them",
			tamper: func(t *testing.T, files []string) {
				lines := readLines(t, files[1])
				lines[1], lines[2] = lines[2], lines[1]
				writeLines(t, files[1], lines)
			},
			wantFile: 1, wantLine: 2, wantReason: "reordered",
		},
		{
			name: "a removed first line of a rotated file is found at its new first line",
			tamper: func(t *testing.T, files []string) {
				removeLine(t, files[2], 1)
			},
			wantFile: 2, wantLine: 1, wantReason: "missing",
		},
		{
			name: "a removed last line of a rotated file is found at the next file's first line",
			tamper: func(t *testing.T, files []string) {
				removeLine(t, files[1], len(readLines(t, files[1])))
			},
			wantFile: 2, wantLine: 1, wantReason: "missing",
		},
		{
			name: "a removed middle rotated file is found at the next file's first line",
			tamper: func(t *testing.T, files []string) {
				require.NoError(t, os.Remove(files[1]))
			},
			wantFile: 2, wantLine: 1, wantReason: "missing",
		},
		{
			name: "a removed first line of the log is found because the log must start with an empty prev_hash",
			tamper: func(t *testing.T, files []string) {
				removeLine(t, files[0], 1)
			},
			wantFile: 0, wantLine: 1, wantReason: "start of the log",
		},
		{
			name: "a malformed line is found",
			tamper: func(t *testing.T, files []string) {
				editLine(t, files[2], 2, func([]byte) []byte { return []byte(`{"id":"x",`) })
			},
			wantFile: 2, wantLine: 2, wantReason: "malformed",
		},
		{
			name: "an empty line is found",
			tamper: func(t *testing.T, files []string) {
				editLine(t, files[0], 2, func([]byte) []byte { return nil })
			},
			wantFile: 0, wantLine: 2, wantReason: "malformed",
		},
		{
			name: "bytes after the hash member are found",
			tamper: func(t *testing.T, files []string) {
				editLine(t, files[0], 3, func(l []byte) []byte { return append(l, ' ') })
			},
			wantFile: 0, wantLine: 3, wantReason: "malformed",
		},
		{
			name: "a last line cut off during a write is found",
			tamper: func(t *testing.T, files []string) {
				path := files[len(files)-1]
				b, err := os.ReadFile(path)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(path, b[:len(b)-10], 0o600))
			},
			wantFile: lastFile, wantLine: -1, wantReason: "cut off",
		},
		{
			name: "a tail removed at a line boundary is not found (a chain alone cannot tell)",
			tamper: func(t *testing.T, files []string) {
				path := files[len(files)-1]
				removeLine(t, path, len(readLines(t, path)))
			},
			wantEvents: events - 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			// One event per batch and a small size: rotation at known lines, about 4 per file.
			writeLog(t, FileConfig{Dir: dir, MaxSize: 2700}, events, WithMaxBatch(1))
			files := listFiles(t, dir)
			require.GreaterOrEqual(t, len(files), 4, "the fixture needs several rotated files")
			linesOfLast := len(readLines(t, files[len(files)-1]))

			tt.tamper(t, files)
			report, err := Verify(dir)
			require.NoError(t, err)

			if tt.wantLine == 0 {
				assert.True(t, report.OK(), "%s", report)
				assert.Equal(t, tt.wantEvents, report.Events)
				return
			}
			require.NotNil(t, report.Break, "the tampering must be detected")
			wantFile := tt.wantFile
			if wantFile == lastFile {
				wantFile = len(files) - 1
			}
			wantLine := tt.wantLine
			if wantLine == -1 {
				wantLine = linesOfLast
			}
			assert.Equal(t, filepath.Base(files[wantFile]), filepath.Base(report.Break.File))
			assert.Equal(t, wantLine, report.Break.Line)
			assert.Contains(t, report.Break.Reason, tt.wantReason)
			assert.Contains(t, report.String(), filepath.Base(files[wantFile]))
		})
	}
}

func TestVerifyCountsEventsAndFiles(t *testing.T) {
	tests := []struct {
		name       string
		events     int
		maxSize    int64
		wantFiles  int
		wantEvents int
		want       string // how the report starts
	}{
		{name: "an empty folder is an intact empty log", events: 0, wantFiles: 0, wantEvents: 0, want: "ok: 0 events in 0 files"},
		{name: "a log in one file", events: 5, wantFiles: 1, wantEvents: 5, want: "ok: 5 events in 1 file "},
		{name: "a rotated log counts every file", events: 10, maxSize: 1500, wantFiles: 5, wantEvents: 10, want: "ok: 10 events in 5 files"},
		{name: "one event is one event", events: 1, wantFiles: 1, wantEvents: 1, want: "ok: 1 event in 1 file "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.events > 0 {
				writeLog(t, FileConfig{Dir: dir, MaxSize: tt.maxSize}, tt.events, WithMaxBatch(1))
			}
			report, err := Verify(dir)
			require.NoError(t, err)
			assert.True(t, report.OK())
			assert.Equal(t, tt.wantFiles, report.Files)
			assert.Equal(t, tt.wantEvents, report.Events)
			assert.True(t, strings.HasPrefix(report.String(), tt.want), report.String())
			if tt.events > 0 {
				assert.Contains(t, report.String(), "(unkeyed chain: anyone who can write the files can recompute it)")
			}
		})
	}
}

func TestVerifyOfAMissingFolderIsAnError(t *testing.T) {
	_, err := Verify(filepath.Join(t.TempDir(), "nope"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func editLine(t *testing.T, path string, n int, edit func([]byte) []byte) {
	t.Helper()
	lines := readLines(t, path)
	lines[n-1] = edit(lines[n-1])
	writeLines(t, path, lines)
}

func removeLine(t *testing.T, path string, n int) {
	t.Helper()
	lines := readLines(t, path)
	writeLines(t, path, append(lines[:n-1], lines[n:]...))
}
