package audit

import (
	"bytes"
	"context"
	"math"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriterConcurrentRecordsAreAllWrittenOnceAndChained: 64 goroutines record at once; every
// event is written exactly once and the log verifies. Blocking delivery runs it with a keyed
// chain and checkpoints on a short interval as well, so that the Records writing batches
// themselves (commit.go) race the background goroutine's checkpoints.
func TestWriterConcurrentRecordsAreAllWrittenOnceAndChained(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		vo   VerifyOptions
	}{
		{"async", nil, VerifyOptions{}},
		{"blocking", []Option{WithDelivery(DeliveryBlocking)}, VerifyOptions{}},
		{"blocking, keyed and signed", []Option{WithDelivery(DeliveryBlocking), WithChainKey(testChainKey),
			WithCheckpoints(CheckpointConfig{Key: testSignKey, EveryEvents: 97, Every: time.Millisecond})},
			VerifyOptions{ChainKey: testChainKey, PublicKey: testPublicKey}},
	} {
		t.Run(tc.name, func(t *testing.T) { testConcurrentRecords(t, tc.opts, tc.vo) })
	}
}

func testConcurrentRecords(t *testing.T, opts []Option, vo VerifyOptions) {
	const goroutines, perGoroutine = 64, 500
	dir := t.TempDir()
	// 64 goroutines keep the queue full, so Record waits for room all the time. With the default
	// 1s wait a slow machine (-race on busy cores) made Record refuse events and the test fail.
	// Waiting an hour means only a sequencer that never drains fails here, and then go test's
	// -timeout ends the run with every goroutine's stack, which shows where it hangs.
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever}, append(opts, WithEnqueueTimeout(time.Hour), WithDeliveryTimeout(time.Hour))...)

	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perGoroutine {
				ev := testEvent(g*perGoroutine + i)
				if err := w.Record(&ev); err != nil {
					t.Errorf("record: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, w.Close(context.Background()))

	ids := map[string]bool{}
	traces := map[string]bool{}
	for _, path := range listFiles(t, dir) {
		require.NoError(t, scanLines(path, func(_ int, line []byte, lineErr error) error {
			require.NoError(t, lineErr)
			if !bytes.Contains(line, []byte(`"trace_id":"`)) {
				return nil // the writer's own records: chain marker, checkpoints
			}
			// The writer's form starts with the id and holds one trace_id; no need to decode.
			id, _, _ := bytes.Cut(bytes.TrimPrefix(line, []byte(`{"id":"`)), []byte(`"`))
			_, trace, _ := bytes.Cut(line, []byte(`"trace_id":"`))
			trace, _, _ = bytes.Cut(trace, []byte(`"`))
			ids[string(id)] = true
			traces[string(trace)] = true
			return nil
		}))
	}
	assert.Len(t, ids, goroutines*perGoroutine, "IDs are unique")
	assert.Len(t, traces, goroutines*perGoroutine, "every recorded event is written exactly once")

	report, err := VerifyWith(dir, vo)
	require.NoError(t, err)
	assert.True(t, report.Complete(), "%s", report)
	assert.Equal(t, goroutines*perGoroutine, report.Events)
	assert.Equal(t, uint64(goroutines*perGoroutine), w.Stats().Written)
}

func TestRecordFillsIDAndTime(t *testing.T) {
	uuidV7 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	given := time.Date(2025, 3, 1, 12, 0, 0, 5, time.FixedZone("CET", 3600))
	tests := []struct {
		name     string
		time     time.Time
		id       string
		wantTime func(t *testing.T, got time.Time)
	}{
		{
			name: "a zero time is set to now",
			wantTime: func(t *testing.T, got time.Time) {
				assert.WithinDuration(t, time.Now(), got, 5*time.Second)
			},
		},
		{
			name: "a caller's time is kept and written in UTC",
			time: given,
			wantTime: func(t *testing.T, got time.Time) {
				assert.True(t, got.Equal(given))
				assert.Equal(t, time.UTC, got.Location())
			},
		},
		{
			name: "a caller's ID is replaced so IDs stay unique",
			id:   "caller-chosen",
			wantTime: func(t *testing.T, got time.Time) {
				assert.False(t, got.IsZero())
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			w := openWriter(t, FileConfig{Dir: dir})
			ev := testEvent(1)
			ev.Time, ev.ID = tt.time, tt.id
			require.NoError(t, w.Record(&ev))
			assert.Regexp(t, uuidV7, ev.ID, "the caller sees the ID after Record")
			require.NoError(t, w.Close(context.Background()))

			res, err := Query(context.Background(), dir, Filter{})
			require.NoError(t, err)
			require.Len(t, res.Events, 1)
			assert.Equal(t, ev.ID, res.Events[0].ID)
			tt.wantTime(t, res.Events[0].Time)
		})
	}
}

func TestRecordKeepsOnlyTheIDAssignIDMinted(t *testing.T) {
	tests := []struct {
		name     string
		prepare  func(ev *Event) string // returns the ID the written event must have, "" for any new one
		keepsOwn bool
	}{
		{"an ID minted by AssignID is kept, so earlier records can name the event", func(ev *Event) string { return ev.AssignID() }, true},
		{"an ID changed after AssignID is replaced", func(ev *Event) string { ev.AssignID(); ev.ID = "caller-chosen"; return "caller-chosen" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			w := openWriter(t, FileConfig{Dir: dir})
			ev := testEvent(1)
			before := tt.prepare(&ev)
			require.NoError(t, w.Record(&ev))
			assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, ev.ID)
			assert.Equal(t, tt.keepsOwn, ev.ID == before)
			require.NoError(t, w.Close(context.Background()))
			res, err := Query(context.Background(), dir, Filter{})
			require.NoError(t, err)
			require.Len(t, res.Events, 1)
			assert.Equal(t, ev.ID, res.Events[0].ID)
		})
	}
}

func TestRecordRefusesEventsThatCannotBeEncoded(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Event)
	}{
		{"NaN duration is refused", func(ev *Event) { ev.Outcome.DurationMS = math.NaN() }},
		{"infinite duration is refused", func(ev *Event) { ev.Outcome.DurationMS = math.Inf(1) }},
		{"time after year 9999 is refused", func(ev *Event) { ev.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWriter(&stubSink{})
			t.Cleanup(func() { _ = w.Close(context.Background()) })
			ev := testEvent(1)
			tt.modify(&ev)
			require.Error(t, w.Record(&ev))
			assert.NoError(t, w.Healthy(), "a refused event does not make the writer unhealthy")
			assert.Equal(t, uint64(1), w.Stats().Rejected)
		})
	}
}

func TestCloseWritesEveryQueuedEvent(t *testing.T) {
	const n = 5000
	dir := t.TempDir()
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncBatch}, WithQueueSize(n), WithMaxBatch(7))
	for i := range n {
		ev := testEvent(i)
		require.NoError(t, w.Record(&ev))
	}
	require.NoError(t, w.Close(context.Background()))

	report, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, report.OK(), "%s", report)
	assert.Equal(t, n, report.Events)
	assert.Equal(t, 0, w.Stats().QueueDepth)
}

func TestRecordAfterCloseIsRefused(t *testing.T) {
	w := NewWriter(&stubSink{})
	require.NoError(t, w.Close(context.Background()))
	ev := testEvent(1)
	assert.ErrorIs(t, w.Record(&ev), ErrClosed)
	assert.NoError(t, w.Close(context.Background()), "Close is idempotent")
}

func TestRestartContinuesTheChain(t *testing.T) {
	dir := t.TempDir()
	cfg := FileConfig{Dir: dir, MaxSize: 3000}
	writeLog(t, cfg, 10)
	writeLog(t, cfg, 10)
	writeLog(t, cfg, 1)

	report, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, report.OK(), "%s", report)
	assert.Equal(t, 21, report.Events)
	assert.Greater(t, report.Files, 1)
}

func TestFailingSinkMakesTheWriterUnhealthyAndRefuseEvents(t *testing.T) {
	sink := &stubSink{}
	w := NewWriter(sink, WithRetryBackoff(5*time.Millisecond))
	ev := testEvent(1)
	require.NoError(t, w.Record(&ev))
	require.Eventually(t, func() bool { return len(sink.written()) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, w.Healthy())

	sink.setFailing(true)
	ev = testEvent(2)
	require.NoError(t, w.Record(&ev), "accepted before the failure is known")
	require.Eventually(t, func() bool { return w.Healthy() != nil }, 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, w.Healthy(), ErrUnhealthy)
	assert.ErrorIs(t, w.Healthy(), errDiskFull, "the reason is visible")

	ev = testEvent(3)
	err := w.Record(&ev)
	assert.ErrorIs(t, err, ErrUnhealthy, "callers fail closed")

	stats := w.Stats()
	assert.False(t, stats.Healthy)
	assert.ErrorIs(t, stats.LastError, errDiskFull)
	assert.Positive(t, stats.FailedWrites)
	assert.Equal(t, uint64(1), stats.Rejected)

	err = w.Close(ctxTimeout(t, 50*time.Millisecond))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 accepted events were not written")
	assert.Equal(t, uint64(1), w.Stats().Lost)
}

func TestWriterRecoversWhenTheSinkDoes(t *testing.T) {
	sink := &stubSink{failing: true}
	w := NewWriter(sink, WithRetryBackoff(5*time.Millisecond))
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	ev := testEvent(1)
	require.NoError(t, w.Record(&ev))
	require.Eventually(t, func() bool { return w.Healthy() != nil }, 5*time.Second, time.Millisecond)

	sink.setFailing(false)
	require.Eventually(t, func() bool { return w.Healthy() == nil }, 5*time.Second, time.Millisecond)
	ev = testEvent(2)
	require.NoError(t, w.Record(&ev))
	require.NoError(t, w.Close(context.Background()))

	lines := sink.written()
	require.Len(t, lines, 2, "the failed batch is written once when the sink recovers")
	first, err := ParseLine([]byte(lines[0]))
	require.NoError(t, err)
	second, err := ParseLine([]byte(lines[1]))
	require.NoError(t, err)
	assert.Equal(t, "t1", first.TraceID)
	assert.Equal(t, first.Hash, second.PrevHash)
	assert.ErrorIs(t, w.Stats().LastError, errDiskFull, "the last error stays visible after recovery")
}

func TestFullQueueBlocksThenRefuses(t *testing.T) {
	sink := &stubSink{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	// No linger: the sequencer takes the first event alone and hangs in its WriteBatch.
	w := NewWriter(sink, WithQueueSize(1), WithEnqueueTimeout(30*time.Millisecond), WithLinger(0))

	first := testEvent(1)
	require.NoError(t, w.Record(&first))
	// The sequencer hangs in WriteBatch with the first event; the second fills the queue. An
	// empty queue alone is not enough: between taking the first event and writing, the
	// sequencer also takes what is queued (a cold run's race step saw the second join the batch).
	select {
	case <-sink.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the sequencer never wrote the first event")
	}
	second := testEvent(2)
	require.NoError(t, w.Record(&second))

	third := testEvent(3)
	start := time.Now()
	err := w.Record(&third)
	assert.ErrorIs(t, err, ErrQueueFull)
	assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "Record waited before refusing")

	close(sink.block)
	require.NoError(t, w.Close(context.Background()))
	assert.Len(t, sink.written(), 2, "both accepted events are written, the refused one is not")
}

// TestLingerGathersABurstIntoOneBatch: events recorded one after another, each enqueued as
// its own, are written in one batch; the linger ends when the batch is full (not by its timer,
// an hour here), and Close writes what a batch still waits for.
func TestLingerGathersABurstIntoOneBatch(t *testing.T) {
	sink := &stubSink{}
	w := NewWriter(sink, WithMaxBatch(4), WithLinger(time.Hour))
	for i := range 4 {
		ev := testEvent(i)
		require.NoError(t, w.Record(&ev))
	}
	require.Eventually(t, func() bool { return len(sink.written()) == 4 }, 5*time.Second, time.Millisecond)
	last := testEvent(9)
	require.NoError(t, w.Record(&last))
	require.NoError(t, w.Close(context.Background()))
	sink.mu.Lock()
	defer sink.mu.Unlock()
	assert.Equal(t, []int{4, 1}, sink.batches)
}

func TestSinkWithoutLastHashStartsUnhealthy(t *testing.T) {
	w := NewWriter(&stubSink{lastErr: errDiskFull})
	assert.ErrorIs(t, w.Healthy(), errDiskFull)
	ev := testEvent(1)
	assert.ErrorIs(t, w.Record(&ev), ErrUnhealthy)
	assert.NoError(t, w.Close(context.Background()))
}
