package audit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/test/redistest"
)

const (
	testStream = "sg:audit"
	testSource = "replica-1"
)

// testReplicaStream is where the mirror of replica testSource appends.
var testReplicaStream = ReplicaStream(testStream, testSource)

// mirrorRig is a Writer on a FileSink wrapped by MirroredSink, and the mirror running in the
// background until the test ends.
type mirrorRig struct {
	dir    string
	w      *Writer
	mirror *StreamMirror
	client *redis.Client
	next   int
	// stop ends the mirror's Run and waits for it.
	stop func()
}

func newMirrorRig(t *testing.T, srv *redistest.Server, cfg FileConfig, scfg StreamConfig, opts ...Option) *mirrorRig {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	cfg.Fsync = FsyncNever
	client := srv.Client(t)
	scfg.Dir, scfg.Stream = cfg.Dir, testStream
	if scfg.Source == "" {
		scfg.Source = testSource
	}
	if scfg.Timeout == 0 {
		scfg.Timeout = 2 * time.Second // generous: test machines are loaded
	}
	scfg.Poll, scfg.RetryBackoff = 50*time.Millisecond, 200*time.Millisecond
	m, err := NewStreamMirror(client, scfg)
	require.NoError(t, err)
	fs, err := OpenFileSink(cfg)
	require.NoError(t, err)
	w := NewWriter(MirroredSink(fs, m), opts...)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.Run(ctx) })
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(func() {
		_ = w.Close(context.Background())
		stop()
	})
	return &mirrorRig{dir: cfg.Dir, w: w, mirror: m, client: client, stop: stop}
}

// write records n events and waits until the writer has written them to the file.
func (r *mirrorRig) write(t *testing.T, n int) {
	t.Helper()
	for range n {
		ev := testEvent(r.next)
		r.next++
		require.NoError(t, r.w.Record(&ev), "writing the file never depends on Redis")
		// One event per batch, so that a small MaxSize rotates between events.
		require.Eventually(t, func() bool { return r.w.Stats().Written == uint64(r.next) }, 10*time.Second, time.Millisecond)
	}
}

func fileIDs(t *testing.T, dir string) []string {
	t.Helper()
	res, err := Query(context.Background(), dir, Filter{Limit: -1})
	require.NoError(t, err)
	return eventIDs(res.Events)
}

func streamIDs(t *testing.T, c *redis.Client) []string {
	t.Helper()
	msgs, err := c.XRange(context.Background(), testReplicaStream, "-", "+").Result()
	require.NoError(t, err)
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i], _ = m.Values[StreamFieldID].(string)
	}
	return ids
}

func eventIDs(evs []Event) []string {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return ids
}

func TestStreamMirrorCopiesEveryLineOnceInOrder(t *testing.T) {
	srv := redistest.Start(t)
	// A small MaxSize rotates the file every few events: the mirror must follow.
	r := newMirrorRig(t, srv, FileConfig{MaxSize: 2 << 10}, StreamConfig{Batch: 7})
	r.write(t, 40)
	require.NoError(t, r.mirror.Sync(ctxTimeout(t, 10*time.Second)))
	require.Greater(t, len(listFiles(t, r.dir)), 3, "the log rotated")

	want := fileIDs(t, r.dir)
	require.Len(t, want, 40)
	assert.Equal(t, want, streamIDs(t, r.client))

	msgs, err := r.client.XRange(context.Background(), testReplicaStream, "-", "+").Result()
	require.NoError(t, err)
	line, _ := msgs[0].Values[StreamFieldLine].(string)
	first := readLines(t, filepath.Join(r.dir, filepath.Base(listFiles(t, r.dir)[0])))[0]
	assert.Equal(t, string(first), line, "the stream holds the line exactly as hashed")
	assert.NoError(t, r.mirror.Healthy())
}

func TestStreamMirrorThroughRedisTrouble(t *testing.T) {
	cases := []struct {
		name    string
		outage  func(*redistest.Server)
		recover func(*redistest.Server)
		// keptBefore: the stream keeps what was mirrored before the outage (a hung server does;
		// a restarted one without persistence starts empty).
		keptBefore bool
	}{
		{"redis hangs while events are written", (*redistest.Server).Pause, (*redistest.Server).Resume, true},
		{"redis is stopped while events are written and restarts empty", (*redistest.Server).Stop, (*redistest.Server).Restart, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			r := newMirrorRig(t, srv, FileConfig{MaxSize: 4 << 10}, StreamConfig{Timeout: 300 * time.Millisecond, Batch: 16})
			r.write(t, 10)
			require.NoError(t, r.mirror.Sync(ctxTimeout(t, 10*time.Second)))

			tc.outage(srv)
			start := time.Now()
			r.write(t, 50) // rotates a few times during the outage too
			assert.Less(t, time.Since(start), 5*time.Second, "file writes are not held up by Redis")
			assert.Len(t, fileIDs(t, r.dir), 60, "the file has every event")
			assert.Eventually(t, func() bool { return r.mirror.Healthy() != nil }, 10*time.Second, 20*time.Millisecond,
				"the mirror reports that it is behind")
			syncStart := time.Now()
			assert.Error(t, r.mirror.Sync(ctxTimeout(t, 500*time.Millisecond)))
			assert.Less(t, time.Since(syncStart), 5*time.Second, "Sync gives up when its context ends")

			tc.recover(srv)
			require.Eventually(t, func() bool {
				ids, err := r.client.XLen(context.Background(), testReplicaStream).Result()
				if !tc.keptBefore {
					return err == nil && ids == 50
				}
				return err == nil && ids == 60
			}, 20*time.Second, 50*time.Millisecond, "the mirror catches up by itself")
			require.NoError(t, r.mirror.Sync(ctxTimeout(t, 10*time.Second)))
			assert.NoError(t, r.mirror.Healthy())
			streams, err := Streams(context.Background(), r.client, testStream)
			require.NoError(t, err)
			assert.Contains(t, streams, testReplicaStream, "the registry lists the stream again at once, also after redis lost it")

			want := fileIDs(t, r.dir)
			if !tc.keptBefore {
				want = want[10:]
			}
			assert.Equal(t, want, streamIDs(t, r.client), "no event lost or repeated in the stream")
		})
	}
}

func TestStreamMirrorResumesFromItsCursor(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	cfg := FileConfig{Dir: dir, MaxSize: 3 << 10}
	first := newMirrorRig(t, srv, cfg, StreamConfig{})
	first.write(t, 12)
	require.NoError(t, first.mirror.Sync(ctxTimeout(t, 10*time.Second)))
	require.NoError(t, first.w.Close(context.Background()))

	// A restart: new writer and mirror on the same folder; events written meanwhile by another
	// process stand in for what was written while no mirror ran.
	writeLog(t, FileConfig{Dir: dir, MaxSize: 3 << 10, Fsync: FsyncNever}, 9)
	second, err := NewStreamMirror(first.client, StreamConfig{Dir: dir, Stream: testStream, Source: testSource, Timeout: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, second.Sync(ctxTimeout(t, 10*time.Second)))
	assert.Equal(t, fileIDs(t, dir), streamIDs(t, first.client), "continues after the last mirrored line, across rotations")
	assert.Zero(t, second.Stats().Relocated)
}

func TestQueryRedis(t *testing.T) {
	srv := redistest.Start(t)
	r := newMirrorRig(t, srv, FileConfig{}, StreamConfig{})
	r.write(t, 20)
	require.NoError(t, r.mirror.Sync(ctxTimeout(t, 10*time.Second)))

	// A lost cursor, with the server's marker gone too (another source name), makes the mirror send
	// everything again: the query counts each event once.
	require.NoError(t, os.Remove(filepath.Join(r.dir, CursorFile)))
	again, err := NewStreamMirror(r.client, StreamConfig{Dir: r.dir, Stream: testStream, Source: "renamed", Timeout: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, again.Sync(ctxTimeout(t, 10*time.Second)))
	require.Len(t, streamIDs(t, r.client), 20)
	again2, err := r.client.XLen(context.Background(), ReplicaStream(testStream, "renamed")).Result()
	require.NoError(t, err)
	require.Equal(t, int64(20), again2, "the renamed replica has a stream of its own")
	require.NoError(t, r.client.XAdd(context.Background(), &redis.XAddArgs{Stream: testReplicaStream, Values: []any{"line", "garbage"}}).Err())

	fromFile, err := Query(context.Background(), r.dir, Filter{Limit: -1})
	require.NoError(t, err)
	cases := []struct {
		name        string
		filter      Filter
		wantIDs     []string
		wantMatched int
	}{
		{"all events, each once, oldest first", Filter{Limit: -1}, eventIDs(fromFile.Events), 20},
		{"the newest N by event time", Filter{Limit: 5}, eventIDs(fromFile.Events[15:]), 20},
		{"a filter that matches nothing", Filter{Sandbox: "other", Limit: -1}, []string{}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := QueryRedis(context.Background(), r.client, testStream, tc.filter)
			require.NoError(t, err)
			assert.Equal(t, tc.wantIDs, eventIDs(res.Events))
			assert.Equal(t, tc.wantMatched, res.Matched)
			assert.Equal(t, 1, res.Malformed)
		})
	}

	_, err = QueryRedis(context.Background(), r.client, testStream, Filter{Decision: "maybe"})
	assert.ErrorContains(t, err, "decision")
}

func TestStreamMirrorTrimsTheStream(t *testing.T) {
	srv := redistest.Start(t)
	r := newMirrorRig(t, srv, FileConfig{}, StreamConfig{MaxLen: 100})
	r.write(t, 600)
	require.NoError(t, r.mirror.Sync(ctxTimeout(t, 20*time.Second)))
	n, err := r.client.XLen(context.Background(), testReplicaStream).Result()
	require.NoError(t, err)
	assert.Less(t, n, int64(400), "MAXLEN ~ keeps the stream near its bound")
	assert.GreaterOrEqual(t, n, int64(100))
}

func TestStreamMirrorStartsOverWhenTheCursorLineIsGone(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	first := newMirrorRig(t, srv, FileConfig{Dir: dir}, StreamConfig{})
	first.write(t, 5)
	require.NoError(t, first.mirror.Sync(ctxTimeout(t, 10*time.Second)))
	require.NoError(t, first.w.Close(context.Background()))
	first.stop() // else its Run may follow the new log and move the cursor before second starts

	// The log is replaced by a new one (a new volume); only the cursor file is left.
	for _, p := range listFiles(t, dir) {
		require.NoError(t, os.Remove(p))
	}
	writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 3)
	second, err := NewStreamMirror(first.client, StreamConfig{Dir: dir, Stream: testStream, Source: testSource, Timeout: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, second.Sync(ctxTimeout(t, 10*time.Second)))
	assert.Equal(t, uint64(1), second.Stats().Relocated)
	ids := streamIDs(t, first.client)
	require.Len(t, ids, 8)
	assert.Equal(t, fileIDs(t, dir), ids[5:], "the new log is mirrored from its start")
}

func TestStreamMirrorCopiesABrokenChainAsItIs(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 6)
	path := filepath.Join(dir, ActiveFile)
	lines := readLines(t, path)
	ev, err := ParseLine(lines[3])
	require.NoError(t, err)
	lines[3] = []byte(strings.Replace(string(lines[3]), ev.PrevHash, strings.Repeat("0", 64), 1))
	writeLines(t, path, lines)

	m, err := NewStreamMirror(srv.Client(t), StreamConfig{Dir: dir, Stream: testStream, Source: testSource, Batch: 1, Timeout: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, m.Sync(ctxTimeout(t, 10*time.Second)), "an edited line does not make the mirror search forever")
	assert.Len(t, streamIDs(t, srv.Client(t)), 6)
}

func TestStreamMirrorCarriesCheckpointsThatQuerySkips(t *testing.T) {
	srv := redistest.Start(t)
	var pub published
	opts := append(checkpointOpts(3, newFakeClock(), &pub), WithChainKey(testChainKey))
	r := newMirrorRig(t, srv, FileConfig{}, StreamConfig{}, opts...)
	r.write(t, 7)
	require.NoError(t, r.w.Close(context.Background()))
	require.NoError(t, r.mirror.Sync(ctxTimeout(t, 10*time.Second)))
	require.Equal(t, []uint64{2, 6, 10}, counts(pub.list), "after a chain record and the first event, 3 more, and 3 more")

	res, err := QueryRedis(context.Background(), r.client, testStream, Filter{Limit: -1})
	require.NoError(t, err)
	assert.Equal(t, 7, res.Matched, "checkpoints and the chain record are not calls")

	// The stream is a copy of the checkpoints outside the audit volume: it verifies the file.
	msgs, err := r.client.XRange(context.Background(), testReplicaStream, "-", "+").Result()
	require.NoError(t, err)
	var lines strings.Builder
	for _, m := range msgs {
		line, _ := m.Values[StreamFieldLine].(string)
		lines.WriteString(line + "\n")
	}
	external, err := ParseCheckpoints(strings.NewReader(lines.String()))
	require.NoError(t, err)
	require.Len(t, external, 3)
	report, err := VerifyWith(r.dir, VerifyOptions{ChainKey: testChainKey, PublicKey: testPublicKey, External: external})
	require.NoError(t, err)
	assert.True(t, report.Complete(), "%s", report)
}

// TestMirrorStartsAtTheOldestFileAfterARotation: a mirror with no cursor starts at the oldest
// file; when the listing it chose from is stale (a rotation renamed audit.log since), it must
// not start on the new, empty audit.log and skip the rotated file's lines. The stale listing
// stands in for the rotation landing between listing and opening, which a fresh-clone CI run
// hit once (the stream lacked the first file's 4 events).
func TestMirrorStartsAtTheOldestFileAfterARotation(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 4)
	require.NoError(t, os.Rename(filepath.Join(dir, ActiveFile), filepath.Join(dir, rotatedName(time.Now())))) // the rotation
	writeLog(t, FileConfig{Dir: dir, Fsync: FsyncNever}, 3)
	files, err := logFiles(dir)
	require.NoError(t, err)
	require.Greater(t, len(files), 1, "the log rotated")
	m, err := NewStreamMirror(nil, StreamConfig{Dir: dir, Stream: testStream, Source: testSource})
	require.NoError(t, err)
	stale := files[len(files)-1:] // listed before the rotation: only audit.log
	require.NoError(t, m.locate(stale))
	fi, err := os.Stat(files[0])
	require.NoError(t, err)
	assert.True(t, os.SameFile(fi, m.pos.info), "starts at the oldest file %s, not at %s", files[0], m.pos.path)
	assert.Zero(t, m.pos.offset)
}
