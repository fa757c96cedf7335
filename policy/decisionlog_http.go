package policy

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// DecisionLogHTTP configures the decision log's HTTP sink: batches of events POSTed the way
// OPA's decision-log plugin uploads them (a JSON array of events, gzip-compressed,
// Content-Encoding: gzip). Zero values take the defaults.
type DecisionLogHTTP struct {
	// URL receives the batches (for an OPA-compatible collector, its service URL + "/logs").
	URL string
	// Client sends them (default: a client with a 30s timeout).
	Client *http.Client
	// MaxBatch is the most events in one POST (default 500).
	MaxBatch int
	// FlushInterval sends a partial batch this long after its first event (default 5s).
	FlushInterval time.Duration
	// QueueSize bounds the events waiting to be sent (default 10000); an event that does not
	// fit is dropped and counted, so a slow or absent collector never holds back the file.
	QueueSize int
	// MaxRetries is how often a failed POST (a transport error or a non-2xx answer) is tried
	// again before its batch is dropped and counted (default 5).
	MaxRetries int
	// MinBackoff and MaxBackoff bound the wait between tries, doubling from MinBackoff
	// (defaults 100ms and 10s).
	MinBackoff, MaxBackoff time.Duration
}

func (c *DecisionLogHTTP) withDefaults() {
	if c.Client == nil {
		c.Client = &http.Client{Timeout: 30 * time.Second}
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 500
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 5 * time.Second
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 10000
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	} else if c.MaxRetries == 0 {
		c.MaxRetries = 5
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(10*time.Second, c.MinBackoff)
	}
}

// httpSink uploads events in batches on its own goroutine.
type httpSink struct {
	cfg   DecisionLogHTTP
	queue chan *[]byte
	done  chan struct{}
	log   *slog.Logger
	zw    *gzip.Writer // reused by gzipBatch

	sent, dropped atomic.Uint64
	sentMetric    metric.Int64Counter
	droppedMetric metric.Int64Counter
}

func newHTTPSink(cfg DecisionLogHTTP, m metric.Meter, log *slog.Logger) *httpSink {
	cfg.withDefaults()
	s := &httpSink{cfg: cfg, queue: make(chan *[]byte, cfg.QueueSize), done: make(chan struct{}), log: log}
	s.sentMetric, _ = m.Int64Counter("sandgate.policy.decision_log.uploaded",
		metric.WithDescription("Decisions accepted by the decision log's HTTP sink."))
	s.droppedMetric, _ = m.Int64Counter("sandgate.policy.decision_log.upload_dropped",
		metric.WithDescription("Decisions not uploaded: the HTTP sink's queue was full or a batch failed every retry."))
	go s.run()
	return s
}

// offer queues one encoded event (a line of the file, newline included) without blocking; a
// full queue drops it. The sink owns ev and returns it to the pool.
func (s *httpSink) offer(ev *[]byte) {
	select {
	case s.queue <- ev:
	default:
		putEventBuffer(ev)
		s.drop(1)
	}
}

func (s *httpSink) drop(n int) {
	s.dropped.Add(uint64(n))
	s.droppedMetric.Add(context.Background(), int64(n))
}

// close sends what is queued (with its retries) and stops. It is called once, after the last
// offer.
func (s *httpSink) close() {
	close(s.queue)
	<-s.done
}

func (s *httpSink) run() {
	defer close(s.done)
	var batch []*[]byte
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	for {
		select {
		case ev, ok := <-s.queue:
			if !ok {
				s.send(batch)
				return
			}
			if len(batch) == 0 {
				flush.Reset(s.cfg.FlushInterval)
			}
			batch = append(batch, ev)
			if len(batch) >= s.cfg.MaxBatch {
				flush.Stop()
				s.send(batch)
				batch = nil
			}
		case <-flush.C:
			s.send(batch)
			batch = nil
		}
	}
}

// send POSTs one batch, retrying with doubling backoff; a batch that fails every try is dropped.
func (s *httpSink) send(batch []*[]byte) {
	if len(batch) == 0 {
		return
	}
	body, err := s.gzipBatch(batch)
	for _, ev := range batch {
		putEventBuffer(ev)
	}
	if err != nil {
		s.log.Error("decision log batch not encoded", "events", len(batch), "err", err)
		s.drop(len(batch))
		return
	}
	wait := s.cfg.MinBackoff
	for try := 0; ; try++ {
		err = s.post(body)
		if err == nil {
			s.sent.Add(uint64(len(batch)))
			s.sentMetric.Add(context.Background(), int64(len(batch)))
			return
		}
		if try >= s.cfg.MaxRetries {
			break
		}
		time.Sleep(wait)
		wait = min(2*wait, s.cfg.MaxBackoff)
	}
	s.log.Error("decision log batch not uploaded; dropped", "url", s.cfg.URL, "events", len(batch), "tries", s.cfg.MaxRetries+1, "err", err)
	s.drop(len(batch))
}

func (s *httpSink) post(body []byte) error {
	req, err := http.NewRequest(http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("decision log upload: %s", resp.Status)
	}
	return nil
}

// gzipBatch is OPA's upload encoding: one JSON array of events, gzip-compressed. The events
// are the bytes the file got; the compressor is reused from batch to batch.
func (s *httpSink) gzipBatch(batch []*[]byte) ([]byte, error) {
	var buf bytes.Buffer
	if s.zw == nil {
		s.zw = gzip.NewWriter(&buf)
	} else {
		s.zw.Reset(&buf)
	}
	sep := []byte{'['}
	for _, ev := range batch {
		line := *ev
		if _, err := s.zw.Write(sep); err != nil {
			return nil, err
		}
		if _, err := s.zw.Write(line[:len(line)-1]); err != nil { // without its newline
			return nil, err
		}
		sep[0] = ','
	}
	if _, err := s.zw.Write([]byte("]\n")); err != nil {
		return nil, err
	}
	if err := s.zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
