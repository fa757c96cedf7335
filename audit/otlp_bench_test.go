package audit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/identity"
)

// benchRouteEvent is an event as the bench's route workload records it: a model request
// through a provider route.
func benchRouteEvent(i int) Event {
	return Event{
		Kind: KindHTTPRequest,
		Identity: identity.Identity{Namespace: "bench", Sandbox: fmt.Sprintf("sb-%d", i%200), Template: "bench-agent",
			Labels: map[string]string{}, SourceIP: fmt.Sprintf("127.10.0.%d", 1+i%200), Known: true},
		Target: Target{Method: "POST", Host: "api.model.test:40601", Path: "/v1/messages", Route: "anthropic",
			Model: "claude-bench"},
		Decision:   Decision{Allow: true, Reason: "model allowed for template", PolicyRevision: "d2950f2d204c9805"},
		Credential: "anthropic",
		Outcome:    Outcome{Status: 200, DurationMS: 147.37, BytesIn: 128, BytesOut: 224, TokensIn: 12, TokensOut: 34},
	}
}

// discardOTLP is an OTLP/HTTP receiver that reads each request and accepts it: what the
// benchmark weighs is the exporter, not a Collector. requests counts them.
func discardOTLP(b *testing.B, requests *atomic.Int64) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// processCPU is the CPU time this process has used (user and system).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkExport measures the OTLP exporter's cost per audit line: b.N route events are
// written first (not timed), then the exporter catches up with the whole log in batches of the
// given size, through a loopback OTLP/HTTP receiver. ns/op, cpu-ns/op (the process's CPU time,
// receiver included: steadier than ns/op on a shared machine) and allocs/op are per line; the
// batch sizes show what a request's fixed cost adds when batches are small.
func BenchmarkExport(b *testing.B) {
	for _, batch := range []int{16, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			dir := b.TempDir()
			w := openWriter(b, FileConfig{Dir: dir, Fsync: FsyncNever})
			for i := range b.N {
				ev := benchRouteEvent(i)
				if err := w.Record(&ev); err != nil {
					b.Fatal(err)
				}
			}
			if err := w.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
			e, err := NewOTLPExporter(OTLPConfig{Dir: dir, Endpoint: discardOTLP(b, new(atomic.Int64)), Insecure: true,
				Follower: FollowerConfig{Batch: batch}})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = e.Shutdown(context.Background()) }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU(b)
			if err := e.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
			b.StopTimer()
			if got := e.Stats().Sent; got != uint64(b.N) {
				b.Fatalf("sent %d lines, want %d", got, b.N)
			}
		})
	}
}

// BenchmarkExportFollowing measures the exporter as it runs beside a writer under the bench's
// closed-loop load: 64 callers per core, each recording a route event every 20ms (a model
// call's time), each write waking the exporter, which follows until it has sent them all.
// cpu-ns/op is the writer's and the exporter's CPU time per event, lines/req how many lines an
// OTLP request carried: what lingering after a wake saves over sending each write's lines at
// once.
func BenchmarkExportFollowing(b *testing.B) {
	for _, linger := range []time.Duration{-1, OTLPLinger} {
		b.Run(fmt.Sprintf("linger=%s", max(linger, 0)), func(b *testing.B) {
			dir := b.TempDir()
			var requests atomic.Int64
			e, err := NewOTLPExporter(OTLPConfig{Dir: dir, Endpoint: discardOTLP(b, &requests), Insecure: true,
				Follower: FollowerConfig{Linger: linger}})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = e.Shutdown(context.Background()) }()
			sink, err := OpenFileSink(FileConfig{Dir: dir, Fsync: FsyncNever})
			if err != nil {
				b.Fatal(err)
			}
			w := NewWriter(NotifyingSink(sink, e.Follower))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = e.Run(ctx); close(done) }()
			b.ReportAllocs()
			b.SetParallelism(64)
			b.ResetTimer()
			cpu := processCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					time.Sleep(20 * time.Millisecond) // the call's own time: load shape, not synchronisation
					ev := benchRouteEvent(i)
					if err := w.Record(&ev); err != nil {
						b.Error(err)
						return
					}
				}
			})
			for deadline := time.Now().Add(time.Minute); e.Stats().Sent < uint64(b.N); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatalf("sent %d of %d lines in a minute", e.Stats().Sent, b.N)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(b.N)/float64(requests.Load()), "lines/req")
			b.StopTimer()
			cancel()
			<-done
			if err := w.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}
