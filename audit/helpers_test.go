package audit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/identity"
)

// testEvent is a plausible tools_call event; i makes it recognisable (TraceID "t<i>").
func testEvent(i int) Event {
	shown := 3
	return Event{
		Kind: KindToolsCall,
		Identity: identity.Identity{
			Namespace: "agents", Sandbox: "sb-1", Template: "coder", Claim: "claim-1",
			Labels: map[string]string{"team": "a", "app": "coder"}, SourceIP: "10.0.0.7", Known: true,
		},
		Target:   Target{Upstream: "github", Tool: "create_issue", ArgsSHA256: strings.Repeat("ab", 32), Shown: &shown},
		Decision: Decision{Allow: true, Reason: "policy ok", PolicyRevision: "rev-1"},
		Outcome:  Outcome{Status: 200, DurationMS: 12.5, BytesIn: 100, BytesOut: 2000},
		TraceID:  "t" + strconv.Itoa(i),
	}
}

// openWriter opens a FileSink on cfg and a Writer on it, closed at the end of the test.
func openWriter(t testing.TB, cfg FileConfig, opts ...Option) *Writer {
	t.Helper()
	sink, err := OpenFileSink(cfg)
	require.NoError(t, err)
	w := NewWriter(sink, opts...)
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

// writeLog records n events (testEvent(0..n-1)) one after another and closes the writer.
func writeLog(t *testing.T, cfg FileConfig, n int, opts ...Option) {
	t.Helper()
	w := openWriter(t, cfg, opts...)
	for i := range n {
		ev := testEvent(i)
		require.NoError(t, w.Record(&ev))
	}
	require.NoError(t, w.Close(context.Background()))
}

// readLines returns the lines of a file without their newlines.
func readLines(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	if len(b) == 0 {
		return nil
	}
	return bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
}

func writeLines(t *testing.T, path string, lines [][]byte) {
	t.Helper()
	var b []byte
	for _, l := range lines {
		b = append(b, l...)
		b = append(b, '\n')
	}
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := logFiles(dir)
	require.NoError(t, err)
	return files
}

// stubSink is the one test double: a sink that fails while failing is set and can be made to
// block, standing in for a full disk or a hung network store. It keeps what it accepted.
type stubSink struct {
	mu      sync.Mutex
	failing bool
	block   chan struct{} // when non-nil, WriteBatch waits for it to close
	entered chan struct{} // when non-nil, WriteBatch sends on it first (buffer it)
	lines   []string
	batches []int // lines per batch written
	lastErr error // returned by LastHash
}

var errDiskFull = errors.New("no space left on device")

func (s *stubSink) LastHash() (string, error) { return "", s.lastErr }

func (s *stubSink) WriteBatch(b *Batch) error {
	s.mu.Lock()
	block, entered := s.block, s.entered
	s.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if block != nil {
		<-block
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing {
		return errDiskFull
	}
	for _, l := range b.Lines {
		s.lines = append(s.lines, string(l))
	}
	s.batches = append(s.batches, len(b.Lines))
	return nil
}

func (s *stubSink) Close() error { return nil }

func (s *stubSink) setFailing(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = v
}

func (s *stubSink) written() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
