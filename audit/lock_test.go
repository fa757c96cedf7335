package audit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Environment of the helper process that holds an audit folder for the lock tests.
const (
	holdDirEnv  = "SANDGATE_TEST_HOLD_AUDIT_DIR"
	holdModeEnv = "SANDGATE_TEST_HOLD_MODE"
)

// TestHelperHoldsAnAuditFolder is not a test: it is the other process of the lock tests
// (holdInAnotherProcess). It takes the folder and says so on stdout, then holds it until its
// stdin closes or it is killed. Mode "sink" opens a FileSink (a running Sandgate); mode "bare"
// only locks the file, as a process caught between taking the lock and writing its name.
func TestHelperHoldsAnAuditFolder(t *testing.T) {
	dir := os.Getenv(holdDirEnv)
	if dir == "" {
		t.Skip("the helper process of the audit folder lock tests")
	}
	switch os.Getenv(holdModeEnv) {
	case "sink":
		s, err := OpenFileSink(FileConfig{Dir: dir})
		require.NoError(t, err)
		defer s.Close()
	default:
		f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
		require.NoError(t, err)
		require.NoError(t, flock(f))
		defer f.Close()
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// holdInAnotherProcess runs TestHelperHoldsAnAuditFolder on dir and returns once it holds the
// folder; the process is killed at the end of the test if it still runs.
func holdInAnotherProcess(t *testing.T, dir, mode string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHelperHoldsAnAuditFolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), holdDirEnv+"="+dir, holdModeEnv+"="+mode)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the helper process did not take the folder")
	require.Equal(t, "held\n", line)
	return cmd
}

// killHolder kills the helper with SIGKILL, as an OOM kill or a node's eviction would, and
// waits until it is gone.
func killHolder(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_, _ = cmd.Process.Wait()
}

func requireTaken(t *testing.T, dir string, err error) *FolderTakenError {
	t.Helper()
	var taken *FolderTakenError
	require.ErrorAs(t, err, &taken)
	assert.Equal(t, dir, taken.Dir)
	assert.Contains(t, err.Error(), dir, "the refusal names the folder")
	return taken
}

// TestAnAuditFolderHasOneWriter: a second sink on a folder someone holds is refused, whoever
// holds it (this process, another one, one that has not written its name), with a message that
// names the folder and the holder; a holder killed at any point leaves the folder free.
func TestAnAuditFolderHasOneWriter(t *testing.T) {
	host, _ := os.Hostname()

	t.Run("a second sink in the same process is refused, naming this process", func(t *testing.T) {
		dir := t.TempDir()
		first, err := OpenFileSink(FileConfig{Dir: dir})
		require.NoError(t, err)
		_, err = OpenFileSink(FileConfig{Dir: dir})
		taken := requireTaken(t, dir, err)
		require.NotNil(t, taken.Holder)
		assert.Equal(t, os.Getpid(), taken.Holder.PID)
		assert.Equal(t, host, taken.Holder.Host)
		assert.WithinDuration(t, time.Now(), taken.Holder.Started, time.Minute)
		assert.Contains(t, err.Error(), "pid "+strconv.Itoa(os.Getpid())+" on host "+host)
		require.NoError(t, first.Close())
		again, err := OpenFileSink(FileConfig{Dir: dir})
		require.NoError(t, err, "a closed sink lets the folder go")
		require.NoError(t, again.Close())
	})

	t.Run("a sink in another process is refused, naming it; killed, it leaves the folder free", func(t *testing.T) {
		dir := t.TempDir()
		holder := holdInAnotherProcess(t, dir, "sink")
		_, err := OpenFileSink(FileConfig{Dir: dir})
		taken := requireTaken(t, dir, err)
		require.NotNil(t, taken.Holder)
		assert.Equal(t, holder.Process.Pid, taken.Holder.PID)
		assert.Contains(t, err.Error(), "pid "+strconv.Itoa(holder.Process.Pid))
		assert.NoFileExists(t, filepath.Join(dir, ActiveFile+".torn-"), "nothing of the folder was touched")

		killHolder(t, holder)
		s, err := OpenFileSink(FileConfig{Dir: dir})
		require.NoError(t, err, "the kernel released the lock of the killed process")
		defer s.Close()
		f, err := os.Open(filepath.Join(dir, LockFile))
		require.NoError(t, err)
		defer f.Close()
		assert.Equal(t, os.Getpid(), readHolder(f).PID, "the new holder's name replaced the dead one's")
	})

	t.Run("a process killed between taking the lock and writing its name", func(t *testing.T) {
		dir := t.TempDir()
		// An earlier holder's name is left in the file, as a killed holder leaves it: a process
		// of this host that is gone.
		gone := exec.Command("true")
		require.NoError(t, gone.Run())
		stale := fmt.Sprintf(`{"pid":%d,"host":%q,"started":"2026-01-01T00:00:00Z"}`, gone.Process.Pid, host)
		require.NoError(t, os.WriteFile(filepath.Join(dir, LockFile), []byte(stale), 0o600))
		holder := holdInAnotherProcess(t, dir, "bare")
		_, err := OpenFileSink(FileConfig{Dir: dir})
		taken := requireTaken(t, dir, err)
		assert.Nil(t, taken.Holder, "the dead process's name is not given as the holder's")
		killHolder(t, holder)
		s, err := OpenFileSink(FileConfig{Dir: dir})
		require.NoError(t, err)
		require.NoError(t, s.Close())
	})

	t.Run("a holder that has not written its name is refused as such", func(t *testing.T) {
		dir := t.TempDir()
		holdInAnotherProcess(t, dir, "bare")
		_, err := OpenFileSink(FileConfig{Dir: dir})
		taken := requireTaken(t, dir, err)
		assert.Nil(t, taken.Holder)
		assert.Contains(t, err.Error(), "has not written its name")
	})

	t.Run("a lock file left half written by a killed holder is taken", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, LockFile), []byte(`{"pid":12`), 0o600))
		s, err := OpenFileSink(FileConfig{Dir: dir})
		require.NoError(t, err)
		require.NoError(t, s.Close())
	})
}

// TestARemovedLockFileStopsTheWriter: removing (or replacing) the lock file of a running sink
// would let a second process lock a new file of that name and write the log too. The running
// sink notices at its next batch and writes nothing more; the second one has the folder alone.
func TestARemovedLockFileStopsTheWriter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, path string)
	}{
		{"removed", func(t *testing.T, path string) { require.NoError(t, os.Remove(path)) }},
		{"replaced by a file renamed over it", func(t *testing.T, path string) {
			other := path + ".new"
			require.NoError(t, os.WriteFile(other, nil, 0o600))
			require.NoError(t, os.Rename(other, path))
		}},
		{"renamed away", func(t *testing.T, path string) { require.NoError(t, os.Rename(path, path+".old")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// The name is looked up at every batch here, as it is once a second by default.
			sink, err := OpenFileSink(FileConfig{Dir: dir, nameCheckEvery: time.Nanosecond})
			require.NoError(t, err)
			w := NewWriter(sink, WithRetryBackoff(time.Millisecond))
			ev := testEvent(0)
			require.NoError(t, w.Record(&ev))
			require.Eventually(t, func() bool { return w.Stats().Written == 1 }, 10*time.Second, time.Millisecond)

			tc.tamper(t, filepath.Join(dir, LockFile))
			second, err := OpenFileSink(FileConfig{Dir: dir})
			require.NoError(t, err, "the folder looks free to a second process now")
			defer second.Close()
			ev = testEvent(1)
			require.NoError(t, w.Record(&ev))
			require.Eventually(t, func() bool {
				herr := w.Healthy()
				return herr != nil && strings.Contains(herr.Error(), "audit lock")
			}, 10*time.Second, time.Millisecond, "the first writer turns unhealthy, and says why")
			assert.Len(t, readLines(t, filepath.Join(dir, ActiveFile)), 1, "the first writer wrote nothing after its lock went")
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			assert.Error(t, w.Close(ctx), "its last event is reported lost, not written")
			assert.Len(t, readLines(t, filepath.Join(dir, ActiveFile)), 1)
		})
	}
}

// TestALockThatCannotBeTakenIsAnError: a folder whose lock cannot be taken for another reason
// than a holder (here: the lock file is a folder; a file system without locks is another) is an
// error that says so, never a sink that runs without the lock.
func TestALockThatCannotBeTakenIsAnError(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, LockFile), 0o700))
	_, err := OpenFileSink(FileConfig{Dir: dir})
	require.Error(t, err)
	var taken *FolderTakenError
	assert.False(t, errors.As(err, &taken))
	assert.Contains(t, err.Error(), "lock the audit folder")
}

// BenchmarkFolderLockCheck is what the lock's check adds to every batch the sink writes (one
// fstat; the name is looked up once a second).
func BenchmarkFolderLockCheck(b *testing.B) {
	l, err := lockFolder(b.TempDir())
	require.NoError(b, err)
	defer l.release()
	for b.Loop() {
		if err := l.check(false); err != nil {
			b.Fatal(err)
		}
	}
}
