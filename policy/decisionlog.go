package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// DecisionPath is the path of every logged decision, OPA's name for the rule that decided.
const DecisionPath = "sandgate/decision"

// BundleName is the key of the policy revision in a logged decision's bundles.
const BundleName = "sandgate"

// DecisionLogConfig configures a DecisionLog. Zero values take the defaults.
type DecisionLogConfig struct {
	// File is the active log file; rotated files sit next to it as File.<UTC time>. Empty:
	// no file (HTTP must then be set).
	File string
	// MaxSize in bytes rotates File before a line would grow it past this size (default 64 MiB).
	MaxSize int64
	// MaxFiles is how many rotated files are kept; older ones are removed (default 10).
	MaxFiles int
	// Mask lists JSON pointers (see CheckMask) whose values are replaced by MaskedValue. Nil
	// takes DefaultMask; an empty, non-nil list masks nothing.
	Mask []string
	// QueueSize bounds the decisions waiting to be written (default 4096); Record drops and
	// counts what does not fit.
	QueueSize int
	// Labels are written on every event (OPA writes id and version there).
	Labels map[string]string
	// Meters receives sandgate.policy.decision_log.dropped and .written.
	Meters metric.MeterProvider
	// Log receives write errors (never decision contents).
	Log *slog.Logger
	// HTTP, if set, also uploads every event in gzip batches as OPA's decision-log plugin does.
	HTTP *DecisionLogHTTP
}

// DecisionLog writes every decision it is given as one line of OPA's decision-log event
// (logs.EventV1) to a rotated file. Record never blocks: it hands the decision to a bounded
// queue and a goroutine builds, masks and writes the event; a decision that finds the queue
// full is dropped and counted, because the request path must not wait for a disk.
//
// The logged result is the decision as Sandgate read it (allow, reason, code, credential),
// and engine-made denials (evaluation errors) are results with their code, never EventV1.Error,
// which OPA's own type cannot decode.
type DecisionLog struct {
	queue chan loggedDecision
	file  *rotatingFile // nil: no file
	http  *httpSink     // nil: no upload
	enc   *eventEncoder
	log   *slog.Logger

	mu     sync.RWMutex // orders Record's send against Close's close(queue)
	closed bool
	stop   chan struct{} // closed with queue: the writer drains it now
	done   chan struct{}

	dropped, written atomic.Uint64
	droppedMetric    metric.Int64Counter
	writtenMetric    metric.Int64Counter
}

type loggedDecision struct {
	id   string
	path string
	at   time.Time
	in   Input
	d    Decision
}

// OpenDecisionLog opens (or continues) the log file and starts its writer; Close stops it.
func OpenDecisionLog(cfg DecisionLogConfig) (*DecisionLog, error) {
	if cfg.File == "" && cfg.HTTP == nil {
		return nil, errors.New("decision log: no file and no HTTP sink")
	}
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = 64 << 20
	}
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles = 10
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if cfg.Mask == nil {
		cfg.Mask = DefaultMask
	}
	if cfg.Meters == nil {
		cfg.Meters = noop.NewMeterProvider()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	masks := make([]maskPointer, len(cfg.Mask))
	for i, p := range cfg.Mask {
		m, err := parseMask(p)
		if err != nil {
			return nil, fmt.Errorf("policy.decision_log.mask[%d]: %w", i, err)
		}
		masks[i] = m
	}
	l := &DecisionLog{queue: make(chan loggedDecision, cfg.QueueSize), enc: newEventEncoder(masks, cfg.Labels),
		log: cfg.Log, stop: make(chan struct{}), done: make(chan struct{})}
	if cfg.File != "" {
		f, err := openRotatingFile(cfg.File, cfg.MaxSize, cfg.MaxFiles)
		if err != nil {
			return nil, err
		}
		l.file = f
	}
	m := cfg.Meters.Meter("github.com/sandgate/sandgate/policy")
	if cfg.HTTP != nil {
		l.http = newHTTPSink(*cfg.HTTP, m, cfg.Log)
	}
	l.droppedMetric, _ = m.Int64Counter("sandgate.policy.decision_log.dropped",
		metric.WithDescription("Decisions not written to the decision log: its queue was full or the file could not be written."))
	l.writtenMetric, _ = m.Int64Counter("sandgate.policy.decision_log.written",
		metric.WithDescription("Decisions written to the decision log."))
	go l.run()
	return l, nil
}

// Record queues one decision for the log: id links it to the call's audit event, in is the
// input the policy saw (it is read later, by the writer: the caller must not change it after
// the decision) and d is the decision. It never blocks.
func (l *DecisionLog) Record(id string, in *Input, d Decision) {
	l.record(id, DecisionPath, in, d)
}

// record queues a decision made under path (DecisionPath, or ShadowPath for a shadow's).
func (l *DecisionLog) record(id, path string, in *Input, d Decision) {
	item := loggedDecision{id: id, path: path, at: time.Now(), in: *in, d: d}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		l.drop()
		return
	}
	select {
	case l.queue <- item:
	default:
		l.drop()
	}
}

func (l *DecisionLog) drop() {
	l.dropped.Add(1)
	if l.droppedMetric != nil {
		l.droppedMetric.Add(context.Background(), 1)
	}
}

// Dropped is how many decisions were not written (queue full, write error, after Close).
func (l *DecisionLog) Dropped() uint64 { return l.dropped.Load() }

// Written is how many decisions were written.
func (l *DecisionLog) Written() uint64 { return l.written.Load() }

// Close writes what is queued and closes the file. Later Records are dropped.
func (l *DecisionLog) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.queue)
	close(l.stop)
	l.mu.Unlock()
	<-l.done
	if l.http != nil {
		l.http.close()
	}
	if l.file == nil {
		return nil
	}
	return l.file.close()
}

// Uploaded is how many decisions the HTTP sink delivered; UploadDropped how many it dropped
// (queue full, or every retry failed).
func (l *DecisionLog) Uploaded() uint64 {
	return l.httpCount(func(s *httpSink) uint64 { return s.sent.Load() })
}

// UploadDropped: see Uploaded.
func (l *DecisionLog) UploadDropped() uint64 {
	return l.httpCount(func(s *httpSink) uint64 { return s.dropped.Load() })
}

func (l *DecisionLog) httpCount(f func(*httpSink) uint64) uint64 {
	if l.http == nil {
		return 0
	}
	return f(l.http)
}

// writeEvery is how often the writer wakes to write what was queued. Waking per decision (a
// parked goroutine's wake-up, a write(2) each) cost more CPU than encoding the event; at this
// interval a queue of the default size fills only above ~800,000 decisions/s.
const writeEvery = 5 * time.Millisecond

func (l *DecisionLog) run() {
	defer close(l.done)
	tick := time.NewTicker(writeEvery)
	defer tick.Stop()
	failing := false
	for {
		closed := l.drain(&failing)
		if l.file != nil && !failing {
			if err := l.file.flush(); err != nil {
				l.log.Error("decision log not written; decisions are dropped until it recovers", "file", l.file.path, "err", err)
				failing = true
			}
		}
		if closed {
			return
		}
		select {
		case <-tick.C:
		case <-l.stop:
		}
	}
}

// drain writes every queued decision; it reports whether the queue is closed.
func (l *DecisionLog) drain(failing *bool) bool {
	for {
		var item loggedDecision
		var ok bool
		select {
		case item, ok = <-l.queue:
			if !ok {
				return true
			}
		default:
			return false
		}
		buf := getEventBuffer()
		*buf = l.enc.encode((*buf)[:0], &item)
		if l.file != nil {
			*failing = l.writeFile(*buf, *failing)
		}
		if l.http != nil {
			l.http.offer(buf) // the sink returns buf to the pool once it is sent
		} else {
			putEventBuffer(buf)
		}
	}
}

// writeFile writes one encoded event; failing says whether the previous write failed, so that
// a failing disk is logged once, and its recovery once.
func (l *DecisionLog) writeFile(line []byte, failing bool) bool {
	if err := l.file.writeLine(line); err != nil {
		l.drop()
		if !failing {
			l.log.Error("decision log not written; decisions are dropped until it recovers", "file", l.file.path, "err", err)
		}
		return true
	}
	if failing {
		l.log.Info("decision log written again", "file", l.file.path)
	}
	l.written.Add(1)
	l.writtenMetric.Add(context.Background(), 1)
	return false
}

// eventBuffers holds encoded events' buffers: one per decision in flight between the writer
// and the HTTP sink, reused rather than allocated per decision.
var eventBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

func getEventBuffer() *[]byte { return eventBuffers.Get().(*[]byte) }

func putEventBuffer(b *[]byte) {
	if cap(*b) <= 64<<10 { // an outsized event's buffer is left to the collector
		eventBuffers.Put(b)
	}
}

// ResultDocument is the logged result of d; DecisionFromResult reads it back.
func ResultDocument(d Decision) any {
	r := map[string]any{"allow": d.Allow, "reason": d.Reason, "code": d.Code}
	if d.Credential != "" {
		r["credential"] = d.Credential
	}
	if d.ReportOnly {
		r["enforce"] = false
	}
	return r
}

// DecisionFromResult reads a logged result (ResultDocument's form); anything else is a deny.
func DecisionFromResult(result *any, revision string) Decision {
	d := Decision{Revision: revision}
	if result == nil {
		return d
	}
	r, _ := (*result).(map[string]any)
	d.Allow, _ = r["allow"].(bool)
	d.Reason, _ = r["reason"].(string)
	d.Code, _ = r["code"].(string)
	d.Credential, _ = r["credential"].(string)
	if enforce, ok := r["enforce"].(bool); ok && !enforce && !d.Allow {
		d.ReportOnly = true
	}
	return d
}
