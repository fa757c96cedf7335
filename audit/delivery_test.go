package audit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBlockingRecordReturnsOnceWritten: a blocking Record does not return while its batch is
// still being written, and returns nil once the sink has it.
func TestBlockingRecordReturnsOnceWritten(t *testing.T) {
	sink := &stubSink{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	w := NewWriter(sink, WithDelivery(DeliveryBlocking))
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	done := make(chan error, 1)
	go func() {
		ev := testEvent(1)
		done <- w.Record(&ev)
	}()
	<-sink.entered // the event's batch is being written
	select {
	case err := <-done:
		t.Fatalf("Record returned (%v) before the sink wrote its event", err)
	default:
	}
	close(sink.block)
	require.NoError(t, <-done)
	assert.Len(t, sink.written(), 1, "the event is in the sink when Record returns")
}

// TestBlockingDeliveryCommitsWhatQueuedDuringAWriteAsOneBatch: group commit. While the first
// event's write hangs, ten more Records queue; they are written together in the next batch,
// and each of them returns only then.
func TestBlockingDeliveryCommitsWhatQueuedDuringAWriteAsOneBatch(t *testing.T) {
	sink := &stubSink{block: make(chan struct{}), entered: make(chan struct{}, 2)}
	w := NewWriter(sink, WithDelivery(DeliveryBlocking))
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	errs := make(chan error, 11)
	record := func(i int) {
		ev := testEvent(i)
		errs <- w.Record(&ev)
	}
	go record(0)
	<-sink.entered // the first event's write hangs
	for i := 1; i <= 10; i++ {
		go record(i)
	}
	require.Eventually(t, func() bool { return w.Stats().QueueDepth == 10 }, 5*time.Second, time.Millisecond)
	assert.Empty(t, errs, "no Record returned while the first write hangs")
	close(sink.block)
	for range 11 {
		require.NoError(t, <-errs)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	assert.Equal(t, []int{1, 10}, sink.batches)
}

// TestBlockingRecordGivesUpWhenTheSinkKeepsFailing: the caller learns that its event's write
// was not confirmed (and cuts its answer) after the delivery timeout, not never.
func TestBlockingRecordGivesUpWhenTheSinkKeepsFailing(t *testing.T) {
	sink := &stubSink{failing: true}
	w := NewWriter(sink, WithDelivery(DeliveryBlocking), WithDeliveryTimeout(50*time.Millisecond), WithRetryBackoff(5*time.Millisecond))
	ev := testEvent(1)
	err := w.Record(&ev)
	require.ErrorIs(t, err, ErrNotDelivered)
	assert.ErrorIs(t, err, errDiskFull, "the sink's reason is given")
	assert.Equal(t, uint64(1), w.Stats().Undelivered)
	require.Error(t, w.Close(ctxTimeout(t, 50*time.Millisecond)))
}

// TestABlockingRecordWhoseWriteFailsIsAnsweredOnceTheRetryLands: while the sink fails the writer
// retries the batch and the Record waits; it returns nil only once the sink has the event, written
// once, and finds the writer healthy again (before, the Record could be told before the writer
// cleared its failure, and a next Record was refused).
func TestABlockingRecordWhoseWriteFailsIsAnsweredOnceTheRetryLands(t *testing.T) {
	sink := &stubSink{failing: true}
	w := NewWriter(sink, WithDelivery(DeliveryBlocking), WithDeliveryTimeout(time.Hour), WithRetryBackoff(time.Millisecond))
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	done := make(chan error, 1)
	go func() {
		ev := testEvent(1)
		done <- w.Record(&ev)
	}()
	require.Eventually(t, func() bool { return w.Stats().FailedWrites >= 2 }, 5*time.Second, time.Millisecond,
		"the failed batch is retried")
	select {
	case err := <-done:
		t.Fatalf("Record returned (%v) before its event was written", err)
	default:
	}
	sink.setFailing(false)
	require.NoError(t, <-done)
	assert.Len(t, sink.written(), 1, "written once")
	require.NoError(t, w.Healthy())
	ev := testEvent(2)
	require.NoError(t, w.Record(&ev), "the writer takes Records again")
	assert.Len(t, sink.written(), 2)
}

// TestBlockingRecordsGiveUpOnAHungWrite: a write that hangs (a stuck network store) is not a
// failing one: no error ever comes back. The Records waiting for it still return ErrNotDelivered
// once it has hung for the delivery timeout, and their events are written, once, when the sink
// comes back.
func TestBlockingRecordsGiveUpOnAHungWrite(t *testing.T) {
	sink := &stubSink{block: make(chan struct{}), entered: make(chan struct{}, 2)}
	w := NewWriter(sink, WithDelivery(DeliveryBlocking), WithDeliveryTimeout(50*time.Millisecond))
	first := make(chan error, 1)
	go func() {
		ev := testEvent(1)
		first <- w.Record(&ev)
	}()
	<-sink.entered // the first event's write hangs
	ev := testEvent(2)
	err := w.Record(&ev)
	require.ErrorIs(t, err, ErrNotDelivered)
	assert.ErrorContains(t, err, "the sink is slow")
	require.ErrorIs(t, <-first, ErrNotDelivered)
	assert.Equal(t, uint64(2), w.Stats().Undelivered)
	close(sink.block)
	require.NoError(t, w.Close(context.Background()))
	assert.Len(t, sink.written(), 2, "the late events are still written, once")
}

// TestBlockingRecordHearsOfAClose: a Record waiting while the sink fails returns as soon as
// Close gives up, with the reason.
func TestBlockingRecordHearsOfAClose(t *testing.T) {
	sink := &stubSink{failing: true}
	w := NewWriter(sink, WithDelivery(DeliveryBlocking), WithDeliveryTimeout(time.Hour), WithRetryBackoff(5*time.Millisecond))
	done := make(chan error, 1)
	go func() {
		ev := testEvent(1)
		done <- w.Record(&ev)
	}()
	require.Eventually(t, func() bool { return w.Healthy() != nil }, 5*time.Second, time.Millisecond)
	require.Error(t, w.Close(ctxTimeout(t, 20*time.Millisecond)))
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrNotDelivered)
	case <-time.After(30 * time.Second):
		t.Fatal("Record still waits after Close gave up")
	}
}

// TestAsyncRecordDoesNotWait: async delivery returns while the write hangs.
func TestAsyncRecordDoesNotWait(t *testing.T) {
	sink := &stubSink{block: make(chan struct{})}
	w := NewWriter(sink, WithDelivery(DeliveryAsync))
	ev := testEvent(1)
	require.NoError(t, w.Record(&ev))
	assert.False(t, w.Blocking())
	close(sink.block)
	require.NoError(t, w.Close(context.Background()))
	assert.Len(t, sink.written(), 1)
}

func TestParseDelivery(t *testing.T) {
	for in, want := range map[string]Delivery{"": DeliveryBlocking, "blocking": DeliveryBlocking, "async": DeliveryAsync} {
		got, err := ParseDelivery(in)
		require.NoError(t, err)
		assert.Equal(t, want, got, in)
	}
	_, err := ParseDelivery("batch")
	assert.ErrorContains(t, err, "audit.delivery")
}
