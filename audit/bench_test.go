package audit

import (
	"context"
	"testing"
)

// BenchmarkRecord measures Record from many goroutines against a real FileSink. Record only
// enqueues, but when the sequencer and the disk fall behind the queue fills and Record waits, so
// ns/op reflects sustained throughput, not just the enqueue.
func BenchmarkRecord(b *testing.B) { benchRecord(b, 1) }

// benchRecord runs Record from parallelism goroutines per core against a real FileSink.
func benchRecord(b *testing.B, parallelism int, opts ...Option) {
	sink, err := OpenFileSink(FileConfig{Dir: b.TempDir(), Fsync: FsyncBatch})
	if err != nil {
		b.Fatal(err)
	}
	w := NewWriter(sink, opts...)
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ev := testEvent(1)
		for pb.Next() {
			if err := w.Record(&ev); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if err := w.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRecordKeyed is BenchmarkRecord with the chain keyed (HMAC-SHA-256 per line).
func BenchmarkRecordKeyed(b *testing.B) { benchRecord(b, 1, WithChainKey(testChainKey)) }

// BenchmarkSealLine measures the sequencer's per-line hashing: the keyed chain must cost no
// allocation beyond the plain one (the hash string itself).
func BenchmarkSealLine(b *testing.B) {
	ev := testEvent(1)
	ev.ID = newID(ev.Time)
	line := appendEvent(nil, &ev)
	for _, c := range []*chainHash{{alg: ChainSHA256}, newKeyedChain(testChainKey)} {
		b.Run(c.alg, func(b *testing.B) {
			buf := make([]byte, 0, 2*len(line))
			b.ReportAllocs()
			for b.Loop() {
				buf = append(buf[:0], line...)
				var err error
				if buf, _, err = c.seal(buf, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRecordDelivery is BenchmarkRecord under each delivery mode, with 64 goroutines per
// core as a loaded replica has calls in flight: blocking returns once the event is written.
func BenchmarkRecordDelivery(b *testing.B) {
	for _, d := range []Delivery{DeliveryAsync, DeliveryBlocking} {
		b.Run(string(d), func(b *testing.B) { benchRecord(b, 64, WithDelivery(d)) })
	}
}

// BenchmarkFileSinkBatchOfOne is the sink's cost for a batch of one event line, the batch a
// blocking writer mostly writes under a loaded replica's spread-out calls: the check that the
// log is still in place (checkFile) and the write.
func BenchmarkFileSinkBatchOfOne(b *testing.B) {
	sink, err := OpenFileSink(FileConfig{Dir: b.TempDir(), Fsync: FsyncNever})
	if err != nil {
		b.Fatal(err)
	}
	line := make([]byte, 730) // an intercepted model call's event, as the bench writes it
	for i := range line {
		line[i] = 'x'
	}
	batch := &Batch{Lines: [][]byte{line}}
	b.ReportAllocs()
	for b.Loop() {
		if err := sink.WriteBatch(batch); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := sink.Close(); err != nil {
		b.Fatal(err)
	}
}
