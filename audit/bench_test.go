package audit

import (
	"context"
	"testing"
)

// BenchmarkRecord measures Record from many goroutines against a real FileSink. Record only
// enqueues, but when the sequencer and the disk fall behind the queue fills and Record waits, so
// ns/op reflects sustained throughput, not just the enqueue.
func BenchmarkRecord(b *testing.B) {
	sink, err := OpenFileSink(FileConfig{Dir: b.TempDir(), Fsync: FsyncBatch})
	if err != nil {
		b.Fatal(err)
	}
	w := NewWriter(sink)
	b.ReportAllocs()
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
