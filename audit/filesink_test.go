package audit

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

func TestRotationKeepsTheChainAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	const maxSize = 4000
	writeLog(t, FileConfig{Dir: dir, MaxSize: maxSize}, 60, WithMaxBatch(2))

	files := listFiles(t, dir)
	require.Greater(t, len(files), 5, "a tiny max size rotates several times")
	assert.Equal(t, ActiveFile, filepath.Base(files[len(files)-1]))
	names := make([]string, len(files)-1)
	for i, f := range files[:len(files)-1] {
		names[i] = filepath.Base(f)
		assert.Regexp(t, `^audit-\d{8}T\d{6}\.\d{9}\.log$`, names[i])
		fi, err := os.Stat(f)
		require.NoError(t, err)
		assert.LessOrEqual(t, fi.Size(), int64(maxSize), "%s stays within the max size", names[i])
	}
	assert.True(t, slices.IsSorted(names), "rotated names sort in rotation order")

	report, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, report.OK(), "%s", report)
	assert.Equal(t, 60, report.Events)
	assert.Equal(t, len(files), report.Files)
}

func TestABatchLargerThanMaxSizeIsWrittenWhole(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir, MaxSize: 100}, 3, WithMaxBatch(1))
	files := listFiles(t, dir)
	assert.Len(t, files, 3, "one event per file, none split")
	report, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, report.OK(), "%s", report)
}

func TestFileSinkCreatesPrivateDirAndFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "audit")
	writeLog(t, FileConfig{Dir: dir, MaxSize: 2000}, 5, WithMaxBatch(1))

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "dir")
	for _, f := range listFiles(t, dir) {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), filepath.Base(f))
	}
}

func TestEveryFsyncModeWritesAVerifiableLog(t *testing.T) {
	tests := []struct {
		name string
		cfg  FileConfig
	}{
		{"batch mode syncs on a timer and on close", FileConfig{Fsync: FsyncBatch, FsyncInterval: time.Millisecond}},
		{"always mode syncs every batch", FileConfig{Fsync: FsyncAlways}},
		{"never mode leaves it to the OS", FileConfig{Fsync: FsyncNever}},
		{"rotation in always mode syncs the old file and the dir", FileConfig{Fsync: FsyncAlways, MaxSize: 3000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.cfg.Dir = dir
			w := openWriter(t, tt.cfg, WithMaxBatch(3))
			for i := range 20 {
				ev := testEvent(i)
				require.NoError(t, w.Record(&ev))
				if i%5 == 0 {
					time.Sleep(2 * time.Millisecond) // let the batch timer fire between writes
				}
			}
			require.NoError(t, w.Close(context.Background()))
			report, err := Verify(dir)
			require.NoError(t, err)
			assert.True(t, report.OK(), "%s", report)
			assert.Equal(t, 20, report.Events)
		})
	}
}

func TestChainContinuesFromTheNewestRotatedFileWhenAuditLogIsGone(t *testing.T) {
	// A crash between renaming audit.log and creating the new one leaves only rotated files.
	dir := t.TempDir()
	cfg := FileConfig{Dir: dir, MaxSize: 2000}
	writeLog(t, cfg, 4, WithMaxBatch(1))
	files := listFiles(t, dir)
	active := files[len(files)-1]
	require.NoError(t, os.Rename(active, filepath.Join(dir, rotatedName(time.Now().Add(time.Hour)))))

	writeLog(t, cfg, 3)
	report, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, report.OK(), "%s", report)
	assert.Equal(t, 7, report.Events)
}

// TestFileSinkReportsARemovedLog removes or replaces the log under a running writer. The name is
// looked up once an hour here, so the first three cases are caught by the open file's link count
// alone, at the next batch; a log renamed away keeps its link, and only the lookup by name (made
// before every batch in those cases) reports it.
func TestFileSinkReportsARemovedLog(t *testing.T) {
	active := func(dir string) string { return filepath.Join(dir, ActiveFile) }
	tests := []struct {
		name      string
		nameEvery time.Duration
		remove    func(dir string) error
		want      string
	}{
		{"a removed dir is reported", time.Hour, os.RemoveAll, "removed"},
		{"a removed audit.log is reported", time.Hour, func(dir string) error { return os.Remove(active(dir)) }, "removed"},
		{"a replaced audit.log is reported", time.Hour, func(dir string) error {
			if err := os.Remove(active(dir)); err != nil {
				return err
			}
			return os.WriteFile(active(dir), nil, 0o600)
		}, "replaced"},
		{"a file renamed over audit.log is reported", time.Hour, func(dir string) error {
			other := filepath.Join(dir, "other")
			if err := os.WriteFile(other, nil, 0o600); err != nil {
				return err
			}
			return os.Rename(other, active(dir))
		}, "replaced"},
		{"an audit.log renamed away is reported by its name", time.Nanosecond, func(dir string) error {
			return os.Rename(active(dir), filepath.Join(dir, "elsewhere"))
		}, "removed"},
		{"an audit.log renamed away and made again is reported by its name", time.Nanosecond, func(dir string) error {
			if err := os.Rename(active(dir), filepath.Join(dir, "elsewhere")); err != nil {
				return err
			}
			return os.WriteFile(active(dir), nil, 0o600)
		}, "replaced"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "audit")
			w := openWriter(t, FileConfig{Dir: dir, nameCheckEvery: tt.nameEvery}, WithRetryBackoff(5*time.Millisecond))
			ev := testEvent(1)
			require.NoError(t, w.Record(&ev))
			require.Eventually(t, func() bool { return w.Stats().Written == 1 }, 5*time.Second, time.Millisecond)

			require.NoError(t, tt.remove(dir))
			ev = testEvent(2)
			require.NoError(t, w.Record(&ev))
			require.Eventually(t, func() bool { return w.Healthy() != nil }, 5*time.Second, time.Millisecond)
			assert.Contains(t, w.Healthy().Error(), tt.want)
			assert.Equal(t, uint64(1), w.Stats().Written, "nothing is written after the log was moved")
			ev = testEvent(3)
			assert.ErrorIs(t, w.Record(&ev), ErrUnhealthy)
			assert.Error(t, w.Close(ctxTimeout(t, 20*time.Millisecond)), "the queued event is reported lost")
		})
	}
}

// TestFileSinkWritesOnUnderItsNameBetweenLookups: between two lookups by name a log renamed away
// keeps receiving the events (they are in the file under its new name, not lost), and the next
// lookup reports it.
func TestFileSinkWritesOnUnderItsNameBetweenLookups(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	sink, err := OpenFileSink(FileConfig{Dir: dir, nameCheckEvery: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	line := func(s string) *Batch { return &Batch{Lines: [][]byte{[]byte(s)}} }
	require.NoError(t, sink.WriteBatch(line("one")))
	moved := filepath.Join(dir, "elsewhere")
	require.NoError(t, os.Rename(filepath.Join(dir, ActiveFile), moved))
	require.NoError(t, sink.WriteBatch(line("two")))

	sink.mu.Lock()
	sink.namedAt = time.Now().Add(-2 * time.Hour) // the next batch looks the name up
	sink.mu.Unlock()
	err = sink.WriteBatch(line("three"))
	require.ErrorContains(t, err, "removed")
	got, err := os.ReadFile(moved)
	require.NoError(t, err)
	assert.Equal(t, "one\ntwo\n", string(got))
}

func TestFileConfigFromTheConfigFile(t *testing.T) {
	tests := []struct {
		name    string
		in      config.AuditFile
		want    FileConfig
		wantErr string
	}{
		{
			name: "sizes are in MiB and the fsync mode carries over",
			in:   config.AuditFile{Dir: "/var/audit", MaxSizeMB: 2, Fsync: "always", FsyncInterval: config.Duration(time.Second)},
			want: FileConfig{Dir: "/var/audit", MaxSize: 2 << 20, Fsync: FsyncAlways, FsyncInterval: time.Second},
		},
		{
			name:    "an unknown fsync mode names the field",
			in:      config.AuditFile{Dir: "/var/audit", Fsync: "sometimes"},
			wantErr: "audit.file.fsync",
		},
		{
			name:    "an empty dir names the field",
			in:      config.AuditFile{Fsync: "batch"},
			wantErr: "audit.file.dir",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FileConfigFrom(tt.in)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
