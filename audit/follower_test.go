package audit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// batchSizes is a Destination that reports the size of each Send.
type batchSizes chan int

func (d batchSizes) Send(_ context.Context, lines [][]byte) error {
	d <- len(lines)
	return nil
}

// TestFollowerLingersAfterANotify: lines written while the follower lingers after a Notify go
// out in one Send, not one Send per write.
func TestFollowerLingersAfterANotify(t *testing.T) {
	dir := t.TempDir()
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever})
	sends := make(batchSizes, 16)
	f, err := NewFollower(FollowerConfig{Dir: dir, CursorFile: "test.cursor", Poll: time.Hour, Linger: time.Minute}, sends)
	require.NoError(t, err)
	lingers := make(chan chan time.Time)
	f.after = func(d time.Duration) <-chan time.Time {
		if d != time.Minute {
			return nil // the hour's poll: never
		}
		c := make(chan time.Time, 1)
		lingers <- c
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = f.Run(ctx) }()

	write := func(from, n int) {
		for i := from; i < from+n; i++ {
			ev := testEvent(i)
			require.NoError(t, w.Record(&ev))
		}
		require.Eventually(t, func() bool { return w.Stats().Written == uint64(from+n) }, 10*time.Second, time.Millisecond)
		f.Notify()
	}
	// A Notify with nothing written: once the follower lingers, its first catch-up (of an empty
	// log) is behind it. Writing before that point raced it: a late-starting Run sent the first
	// line alone, which a busy CI machine once did.
	f.Notify()
	linger := receive(t, lingers)
	write(0, 10)
	linger <- time.Now()
	assert.Equal(t, 10, receive(t, sends), "the ten lines written while it lingered, in one Send")
	receive(t, lingers) // the writes' Notify: the follower is past its catch-up and lingers again
	assert.Empty(t, sends, "nothing was left to send")
}

// receive returns the next value of c, failing t when none comes in 10s.
func receive[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received in 10s")
	}
	var zero T
	return zero
}

// refusingDestination takes every batch and refuses the lines whose event ID is in refuse for
// good, as an OTLP partial success does; it keeps every line it was sent, repeats included.
type refusingDestination struct {
	refuse map[string]bool
	got    []string
}

func (d *refusingDestination) Send(_ context.Context, lines [][]byte) error {
	n := 0
	for _, l := range lines {
		id := lineID(l)
		d.got = append(d.got, id)
		if d.refuse[id] {
			n++
		}
	}
	if n > 0 {
		return &RejectedError{Lines: int64(n), Reason: "field too long"}
	}
	return nil
}

// TestFollowerMovesPastLinesRefusedForGood: a batch the destination took with lines refused for
// good (an OTLP partial success, which OTLP forbids sending again) is not sent again: the
// follower counts the refused lines, reports them, stays healthy and goes on with the rest of
// the log; the file keeps them.
func TestFollowerMovesPastLinesRefusedForGood(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 10)
	lines := readLines(t, filepath.Join(dir, ActiveFile))
	dest := &refusingDestination{refuse: map[string]bool{lineID(lines[2]): true, lineID(lines[3]): true}}
	var reported []error
	f, err := NewFollower(FollowerConfig{Dir: dir, CursorFile: "test.cursor", Batch: 4,
		OnRejected: func(err error) { reported = append(reported, err) }}, dest)
	require.NoError(t, err)
	require.NoError(t, f.Sync(ctxTimeout(t, 10*time.Second)))

	var want []string
	for _, l := range lines {
		want = append(want, lineID(l))
	}
	assert.Equal(t, want, dest.got, "every line sent once, in order: the refused batch was not sent again")
	s := f.Stats()
	assert.Equal(t, uint64(2), s.Rejected)
	assert.Equal(t, uint64(8), s.Sent)
	assert.Zero(t, s.Failed)
	assert.NoError(t, f.Healthy())
	require.Len(t, reported, 1, "one report for the one batch with refusals")
	assert.Contains(t, reported[0].Error(), "refused 2 lines for good")
	assert.Contains(t, reported[0].Error(), "field too long")
}

// TestBatchReaderReadsWholeLinesAcrossBatches: lines longer than the read buffer come whole, a
// batch stops at max lines or at a line still being written (partial), and the buffers kept
// from one batch to the next do not mix batches.
func TestBatchReaderReadsWholeLinesAcrossBatches(t *testing.T) {
	want := []string{"short", strings.Repeat("a", 70<<10), "", strings.Repeat("b", 200<<10), "last"}
	path := filepath.Join(t.TempDir(), "audit.log")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(want, "\n")+"\nhalf a li"), 0o600))
	fi, err := os.Stat(path)
	require.NoError(t, err)

	var b batchReader
	var offset int64
	var got []string
	for _, max := range []int{2, 2, 2, 2} {
		lines, ends, partial, err := b.read(path, fi, offset, max)
		require.NoError(t, err)
		for i, l := range lines {
			got = append(got, string(l))
			offset = ends[i]
		}
		assert.Equal(t, len(got) == len(want), partial, "partial only once the complete lines are read")
	}
	assert.Equal(t, want, got)
	assert.Equal(t, int64(len(strings.Join(want, "\n"))+1), offset)

	require.NoError(t, os.Rename(path, path+".1"))
	require.NoError(t, os.WriteFile(path, []byte("other\n"), 0o600))
	_, _, _, err = b.read(path, fi, 0, 2)
	assert.ErrorIs(t, err, errMoved, "another file under the name")
}

// cursorWatcher is a Destination that records, at each Send, the cursor file as it is then.
type cursorWatcher struct {
	path    string
	seen    []string
	onSend  func()
	batches int
}

func (d *cursorWatcher) Send(context.Context, [][]byte) error {
	b, _ := os.ReadFile(d.path)
	d.seen = append(d.seen, string(b))
	d.batches++
	if d.onSend != nil {
		d.onSend()
	}
	return nil
}

// TestFollowerWritesItsCursorOnceCaughtUp: a catch-up writes its cursor when it has caught up,
// not after every batch (a file written and renamed per batch was a quarter of the exporter's
// CPU), and at most cursorSaveEvery apart while it goes on; a follower started afterwards sends
// nothing again.
func TestFollowerWritesItsCursorOnceCaughtUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		tick time.Duration // how far the clock moves at each Send
	}{{"a quick catch-up", 0}, {"a catch-up longer than cursorSaveEvery", cursorSaveEvery}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 10)
			clock := time.Unix(1_000_000, 0)
			dest := &cursorWatcher{path: filepath.Join(dir, "test.cursor"), onSend: func() { clock = clock.Add(tc.tick) }}
			f, err := NewFollower(FollowerConfig{Dir: dir, CursorFile: "test.cursor", Batch: 3}, dest)
			require.NoError(t, err)
			f.now = func() time.Time { return clock }
			f.savedAt = clock // as if just written: the first batch does not write it either
			require.NoError(t, f.Sync(ctxTimeout(t, 10*time.Second)))

			require.Equal(t, 4, dest.batches)
			assert.Empty(t, dest.seen[0], "no cursor before the first batch")
			for i := 1; i < len(dest.seen); i++ {
				if tc.tick == 0 {
					assert.Empty(t, dest.seen[i], "batch %d: not written in the middle of a quick catch-up", i)
				} else {
					assert.NotEqual(t, dest.seen[i-1], dest.seen[i], "batch %d: a slow catch-up writes it as it goes", i)
				}
			}
			again := &cursorWatcher{path: dest.path}
			g, err := NewFollower(FollowerConfig{Dir: dir, CursorFile: "test.cursor", Batch: 3}, again)
			require.NoError(t, err)
			require.NoError(t, g.Sync(ctxTimeout(t, 10*time.Second)))
			assert.Zero(t, again.batches, "the cursor written at the end says everything was sent")
		})
	}
}

// idRecorder is a Destination that keeps the event ID of every line sent.
type idRecorder struct{ ids []string }

func (d *idRecorder) Send(_ context.Context, lines [][]byte) error {
	for _, l := range lines {
		d.ids = append(d.ids, lineID(l))
	}
	return nil
}

// TestFollowerThatLosesItsFileContinuesAfterItsLastLine: a follower that cannot find the file it
// was reading (a rotation between its listing and its stat) goes on after the last line it sent,
// not after the older line of a cursor file saved before it: nothing is sent twice.
func TestFollowerThatLosesItsFileContinuesAfterItsLastLine(t *testing.T) {
	dir := t.TempDir()
	cfg := FileConfig{Dir: dir, Fsync: FsyncNever}
	cursor := filepath.Join(dir, "test.cursor")
	dest := &idRecorder{}
	f, err := NewFollower(FollowerConfig{Dir: dir, CursorFile: "test.cursor", Batch: 3}, dest)
	require.NoError(t, err)
	sync := func() { require.NoError(t, f.Sync(ctxTimeout(t, 10*time.Second))) }

	writeLog(t, cfg, 6)
	sync()
	stale, err := os.ReadFile(cursor)
	require.NoError(t, err)
	writeLog(t, cfg, 3)
	sync()
	// The cursor as it was before the last catch-up's save (saves are at most every
	// cursorSaveEvery apart), and the follower's file out of sight.
	require.NoError(t, os.WriteFile(cursor, stale, 0o600))
	f.pos.info = nil
	writeLog(t, cfg, 2)
	sync()

	var want []string
	for _, l := range readLines(t, filepath.Join(dir, ActiveFile)) {
		want = append(want, lineID(l))
	}
	require.Len(t, want, 11)
	assert.Equal(t, want, dest.ids, "every line once, in order")
}
