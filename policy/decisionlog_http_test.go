package policy_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/policy"
)

// collector is a decision-log service on loopback: it decodes every batch as OPA's
// decision-log plugin sends it (gzip, a JSON array of logs.EventV1). The first `fail` requests
// are answered 503; while `hold` is set, each request first reports itself on arrived and waits
// for release.
type collector struct {
	mu       sync.Mutex
	batches  [][]logs.EventV1
	raw      []json.RawMessage // every event as it arrived
	requests int
	fail     int
	arrived  chan struct{}
	release  chan struct{}
}

func newCollector(t *testing.T, c *collector) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.arrived != nil {
			c.arrived <- struct{}{}
			<-c.release
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.requests++
		if c.requests <= c.fail {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		if r.Method != http.MethodPost || r.Header.Get("Content-Encoding") != "gzip" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "not a decision-log upload", http.StatusBadRequest)
			return
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(zr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var batch []logs.EventV1
		var raw []json.RawMessage
		if err := errors.Join(json.Unmarshal(body, &batch), json.Unmarshal(body, &raw)); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.batches = append(c.batches, batch)
		c.raw = append(c.raw, raw...)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/logs"
}

func (c *collector) events() []logs.EventV1 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []logs.EventV1
	for _, b := range c.batches {
		all = append(all, b...)
	}
	return all
}

func record(l *policy.DecisionLog, n int) {
	for i := range n {
		l.Record(fmt.Sprintf("id-%d", i), toolCall(map[string]any{"token": "s3cret"}), policy.Decision{Allow: true, Reason: "ok", Code: "allow", Revision: "r1"})
	}
}

func TestDecisionLogHTTPSinkPostsGzipBatchesOPADecodes(t *testing.T) {
	c := &collector{}
	url := newCollector(t, c)
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{HTTP: &policy.DecisionLogHTTP{URL: url, MaxBatch: 3, FlushInterval: time.Hour}})
	require.NoError(t, err)
	record(l, 7)
	require.NoError(t, l.Close(), "Close sends the partial batch")

	require.Len(t, c.batches, 3)
	assert.Equal(t, []int{3, 3, 1}, []int{len(c.batches[0]), len(c.batches[1]), len(c.batches[2])})
	events := c.events()
	for i, ev := range events {
		assert.Equal(t, fmt.Sprintf("id-%d", i), ev.DecisionID)
		assert.Equal(t, policy.DecisionPath, ev.Path)
		assert.Equal(t, "r1", ev.Bundles[policy.BundleName].Revision)
		args := (*ev.Input).(map[string]any)["mcp"].(map[string]any)["arguments"].(map[string]any)
		assert.Equal(t, policy.MaskedValue, args["token"], "uploads are masked like the file")
	}
	assert.Equal(t, uint64(7), l.Uploaded())
	assert.Zero(t, l.UploadDropped())
}

func TestDecisionLogUploadsTheBytesTheFileGot(t *testing.T) {
	c := &collector{}
	url := newCollector(t, c)
	path := filepath.Join(t.TempDir(), "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path, Labels: map[string]string{"id": "r1"},
		HTTP: &policy.DecisionLogHTTP{URL: url, MaxBatch: 2, FlushInterval: time.Hour}})
	require.NoError(t, err)
	record(l, 5)
	require.NoError(t, l.Close())

	file, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := bytes.Split(bytes.TrimSuffix(file, []byte("\n")), []byte("\n"))
	require.Len(t, lines, 5)
	require.Len(t, c.raw, 5)
	for i := range lines {
		assert.Equal(t, string(lines[i]), string(c.raw[i]), "event %d", i)
	}
}

func TestDecisionLogHTTPSinkRetriesWithBackoff(t *testing.T) {
	c := &collector{fail: 2}
	url := newCollector(t, c)
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{HTTP: &policy.DecisionLogHTTP{URL: url, FlushInterval: time.Hour,
		MinBackoff: time.Millisecond, MaxRetries: 3}})
	require.NoError(t, err)
	record(l, 2)
	require.NoError(t, l.Close())
	assert.Equal(t, 3, c.requests, "two 503s, then accepted")
	assert.Len(t, c.events(), 2)
	assert.Equal(t, uint64(2), l.Uploaded())
}

func TestDecisionLogHTTPSinkDropsAndCountsABatchThatFailsEveryTry(t *testing.T) {
	c := &collector{fail: 1000}
	url := newCollector(t, c)
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{HTTP: &policy.DecisionLogHTTP{URL: url, FlushInterval: time.Hour,
		MinBackoff: time.Millisecond, MaxRetries: 2}})
	require.NoError(t, err)
	record(l, 2)
	require.NoError(t, l.Close())
	assert.Equal(t, 3, c.requests, "one try and two retries")
	assert.Equal(t, uint64(2), l.UploadDropped())
	assert.Zero(t, l.Uploaded())
}

func TestDecisionLogHTTPSinkQueueFullDropsWithoutHoldingBackTheFile(t *testing.T) {
	c := &collector{arrived: make(chan struct{}), release: make(chan struct{})}
	url := newCollector(t, c)
	path := filepath.Join(t.TempDir(), "decisions.log")
	l, err := policy.OpenDecisionLog(policy.DecisionLogConfig{File: path,
		HTTP: &policy.DecisionLogHTTP{URL: url, MaxBatch: 1, QueueSize: 1}})
	require.NoError(t, err)
	record(l, 1)
	<-c.arrived // the sink is now stuck in its first POST
	record(l, 10)
	// The file is written whatever the stuck sink does.
	require.Eventually(t, func() bool { return l.Written() == 11 }, 30*time.Second, time.Millisecond)
	go func() {
		for range c.arrived {
		}
	}()
	close(c.release)
	require.NoError(t, l.Close())
	close(c.arrived)

	assert.Len(t, readDecisionLog(t, path), 11, "the file has every decision")
	assert.Zero(t, l.Dropped())
	assert.Equal(t, uint64(11), l.Uploaded()+l.UploadDropped())
	assert.GreaterOrEqual(t, l.UploadDropped(), uint64(9), "one in flight, one queued: the rest dropped")
}
