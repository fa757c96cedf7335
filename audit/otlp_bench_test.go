package audit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
// benchmark weighs is the exporter, not a Collector.
func discardOTLP(b *testing.B) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
			e, err := NewOTLPExporter(OTLPConfig{Dir: dir, Endpoint: discardOTLP(b), Insecure: true,
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
