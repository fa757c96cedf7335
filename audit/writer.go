package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Errors Record returns. Callers deny the call on any error from Record.
var (
	// ErrClosed is returned by Record after Close.
	ErrClosed = errors.New("audit writer is closed")
	// ErrQueueFull is returned when the queue stayed full for the enqueue timeout.
	ErrQueueFull = errors.New("audit queue is full")
	// ErrUnhealthy wraps the sink's error while the writer cannot write.
	ErrUnhealthy = errors.New("audit log cannot be written")
)

// The Recorder interface (recorder.go) is what the request path sees of a Writer.
var _ Recorder = (*Writer)(nil)

// Writer assigns IDs, chains and writes events to a Sink. See the package documentation for the
// delivery contract. A Writer is safe for concurrent use; it never logs event contents.
type Writer struct {
	sink           Sink
	queue          chan Event
	enqueueTimeout time.Duration
	maxBatch       int
	linger         time.Duration
	retryMax       time.Duration
	clock          Clock

	// blocking makes Record wait for the write (DeliveryBlocking), at most deliveryTimeout;
	// writingSince is when the batch in the sink was first tried (0: none), and stuck is closed
	// when that was longer ago than deliveryTimeout (delivery.go).
	blocking        bool
	deliveryTimeout time.Duration
	writingSince    atomic.Int64
	stuck           atomic.Pointer[chan struct{}]

	// chainKey keys the chain (nil: plain SHA-256); checkpoints is nil when none are written.
	chainKey    []byte
	checkpoints *CheckpointConfig

	// mu orders Record's send against Close's close(queue): Record holds it shared while sending.
	mu     sync.RWMutex
	closed bool

	closeOnce sync.Once
	abort     chan struct{} // closed when Close's context ends: stop retrying
	done      chan struct{} // closed when the sequencer has exited

	// fatal is set at construction when the sink's last hash could not be read; never cleared.
	fatal error
	// failure is the current sink error, nil while healthy.
	failure atomic.Pointer[failure]
	// lastErr is the most recent sink error, kept after recovery for Stats.
	lastErr atomic.Pointer[failure]

	// reserve is what the writer may owe the sink, in line bytes (0: the sink keeps no
	// reserve); owed is what the accepted, unwritten events and the slots of calls in flight
	// hold of it; short is set while the sink's reserve is not whole (reserve.go).
	reserve int64
	owed    atomic.Int64
	short   atomic.Bool

	written  atomic.Uint64
	failed   atomic.Uint64
	rejected atomic.Uint64
	lost     atomic.Uint64
	// undelivered counts blocking Records that stopped waiting (delivery timeout).
	undelivered atomic.Uint64
}

type failure struct {
	err  error
	time time.Time
}

// Option configures a Writer.
type Option func(*Writer)

// WithQueueSize sets how many accepted events may wait for the sequencer (default 4096).
func WithQueueSize(n int) Option {
	return func(w *Writer) {
		if n > 0 {
			w.queue = make(chan Event, n)
		}
	}
}

// WithEnqueueTimeout sets how long Record waits for room in a full queue before it returns
// ErrQueueFull (default 1s).
func WithEnqueueTimeout(d time.Duration) Option {
	return func(w *Writer) {
		if d > 0 {
			w.enqueueTimeout = d
		}
	}
}

// WithMaxBatch caps the events handed to the sink in one WriteBatch (default 512).
func WithMaxBatch(n int) Option {
	return func(w *Writer) {
		if n > 0 {
			w.maxBatch = n
		}
	}
}

// WithLinger is how long a batch smaller than the maximum waits for more events before it is
// written (default 2ms; 0 writes what is queued at once). With async delivery nothing waits for
// a batch to be written (Record returns once the event is queued), so lingering costs no request
// any time: it turns one write per one or two events into one per dozens at thousands of
// requests a second. A blocking writer ignores it (its callers wait for the write): it lingers
// only while its calls come in together, briefly (blockingLinger). Close still writes everything
// queued.
func WithLinger(d time.Duration) Option {
	return func(w *Writer) {
		if d >= 0 {
			w.linger = d
		}
	}
}

// WithRetryBackoff caps the wait between retries of a failed batch (default 1s).
func WithRetryBackoff(d time.Duration) Option {
	return func(w *Writer) {
		if d > 0 {
			w.retryMax = d
		}
	}
}

// WithChainKey keys the chain: each line's hash is the HMAC-SHA-256 of its canonical form under
// key instead of its SHA-256, so that only a holder of the key can recompute it. The writer starts
// its part of the log with a KindChain record naming the algorithm and ChainKeyID(key). A key
// shorter than MinChainKeyLen makes the writer refuse every event.
func WithChainKey(key []byte) Option {
	return func(w *Writer) { w.chainKey = bytes.Clone(key) }
}

// CheckpointConfig configures signed checkpoints (see Checkpoint).
type CheckpointConfig struct {
	// Key signs the checkpoints.
	Key ed25519.PrivateKey
	// EveryEvents writes a checkpoint after this many call events since the last one (default 1000).
	EveryEvents int
	// Every writes a checkpoint this often when events were written since the last one (default 1m).
	Every time.Duration
	// Published, if set, is called with each checkpoint once the sink has stored it, from the
	// writer's goroutine: keep a copy out of reach of whoever can write the log. It must not block.
	Published func(Checkpoint)
}

// WithCheckpoints makes the writer append a signed checkpoint after its first call event, every
// c.EveryEvents call events, every c.Every when events were written since the last one, and on
// Close. The sink must implement LineCounter, since a checkpoint counts the lines from the start
// of the log.
func WithCheckpoints(c CheckpointConfig) Option {
	return func(w *Writer) {
		if c.EveryEvents <= 0 {
			c.EveryEvents = 1000
		}
		if c.Every <= 0 {
			c.Every = time.Minute
		}
		w.checkpoints = &c
	}
}

// Clock is the writer's source of time for checkpoints; tests replace it.
type Clock interface {
	Now() time.Time
	// Every returns a channel that delivers a tick every d, and a function that stops it.
	Every(d time.Duration) (ticks <-chan time.Time, stop func())
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Every(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// WithClock replaces the system clock for checkpoint times and the checkpoint interval.
func WithClock(c Clock) Option {
	return func(w *Writer) {
		if c != nil {
			w.clock = c
		}
	}
}

// LineCounter is implemented by sinks that can count the lines they hold from the start of the
// log, which a writer with checkpoints needs to continue counting after a restart.
type LineCounter interface {
	CountLines() (uint64, error)
}

// NewWriter starts a Writer on sink; Close stops it and closes the sink. If the sink cannot tell
// its last hash the writer starts unhealthy and refuses every event, since a chain continued from
// a guess would not verify.
func NewWriter(sink Sink, opts ...Option) *Writer {
	w := &Writer{
		sink:           sink,
		enqueueTimeout: time.Second,
		maxBatch:       512,
		linger:         2 * time.Millisecond,
		retryMax:       time.Second,
		clock:          systemClock{},

		deliveryTimeout: 10 * time.Second,
		abort:           make(chan struct{}),
		done:            make(chan struct{}),
	}
	for _, o := range opts {
		o(w)
	}
	if w.queue == nil {
		w.queue = make(chan Event, 4096)
	}
	if w.blocking {
		w.linger = 0 // group commit: the callers wait, and what queues during a write goes next
	}
	stuck := make(chan struct{})
	w.stuck.Store(&stuck)
	if r, ok := sink.(Reserver); ok {
		w.reserve = max(r.ReserveBytes()-reserveMargin, 0)
	}
	s, err := w.newSequencer()
	if err != nil {
		w.fatal = fmt.Errorf("%w: %w", ErrUnhealthy, err)
		w.lastErr.Store(&failure{err: w.fatal, time: time.Now()})
		close(w.done)
		return w
	}
	w.checkReserve() // a disk already full at start: unhealthy until space is freed
	go w.sequence(s)
	if w.blocking {
		go w.watchStuck()
	}
	return w
}

// Record accepts one event for writing. It sets ev.ID (always, unless Event.AssignID minted it:
// IDs are never the caller's choice, so they are unique) and ev.Time (when zero) before it returns, so the caller can log the ID; PrevHash and
// Hash are filled in on the writer's copy only. Record copies the event: the caller may reuse ev,
// but must not modify the maps and pointers it shares (Identity.Labels, Target.Shown/Hidden).
//
// A nil error means the event will be written exactly once, in order, unless the writer becomes
// unhealthy; with blocking delivery, that it has been written. On any error the caller must fail
// closed: the event was not accepted, or (ErrNotDelivered, blocking delivery) its write was not
// confirmed in time.
//
// With a sink that keeps a reserve (Reserver), the event's line must also fit in what is left
// of the reserve, else Record returns ErrReserveExhausted; a call that took a Slot records with
// RecordReserved instead.
func (w *Writer) Record(ev *Event) error {
	if err := w.Healthy(); err != nil {
		w.rejected.Add(1)
		return err
	}
	w.prepare(ev)
	if err := checkEncodable(ev); err != nil {
		w.rejected.Add(1)
		return err
	}
	ev.owed = 0
	if w.reserve > 0 {
		n := lineBytes(ev)
		if !w.take(n) {
			w.rejected.Add(1)
			return ErrReserveExhausted
		}
		ev.owed = n
	}
	if err := w.enqueue(ev); err != nil {
		w.owed.Add(-ev.owed)
		return err
	}
	return nil
}

// prepare sets ev's time (when zero) and ID.
func (w *Writer) prepare(ev *Event) {
	now := time.Now()
	if ev.Time.IsZero() {
		ev.Time = now
	}
	if ev.ID == "" || ev.ID != ev.assignedID {
		ev.ID = newID(now)
	}
}

// enqueue hands a copy of ev to the sequencer, waiting at most the enqueue timeout for room;
// with blocking delivery it then waits for the write (awaitWrite).
func (w *Writer) enqueue(ev *Event) error {
	if !w.blocking {
		return w.send(ev)
	}
	ack := acks.Get().(chan error)
	ev.ack = ack
	err := w.send(ev)
	ev.ack = nil
	if err != nil {
		acks.Put(ack)
		return err
	}
	return w.awaitWrite(ack)
}

// send puts a copy of ev in the queue.
func (w *Writer) send(ev *Event) error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		w.rejected.Add(1)
		return ErrClosed
	}
	select {
	case w.queue <- *ev:
		return nil
	default:
	}
	t := time.NewTimer(w.enqueueTimeout)
	defer t.Stop()
	select {
	case w.queue <- *ev:
		return nil
	case <-t.C:
		w.rejected.Add(1)
		return fmt.Errorf("record event: waited %s: %w", w.enqueueTimeout, ErrQueueFull)
	}
}

// checkEncodable rejects the few values encoding/json cannot write, so that an accepted event can
// always be encoded by the sequencer, and the kinds of the writer's own records.
func checkEncodable(ev *Event) error {
	if isRecordKind(ev.Kind) {
		return fmt.Errorf("record event: kind %q is reserved for the audit log's own records", ev.Kind)
	}
	if d := ev.Outcome.DurationMS; math.IsNaN(d) || math.IsInf(d, 0) {
		return errors.New("record event: outcome.duration_ms is not a finite number")
	}
	if y := ev.Time.UTC().Year(); y < 0 || y > 9999 {
		return errors.New("record event: time is outside years 0-9999")
	}
	return nil
}

// Healthy returns nil while events can be written, and otherwise the reason they cannot.
func (w *Writer) Healthy() error {
	if w.fatal != nil {
		return w.fatal
	}
	if f := w.failure.Load(); f != nil {
		return f.err
	}
	return nil
}

// Stats is a snapshot of the writer's counters, for metrics and health endpoints.
type Stats struct {
	QueueDepth    int
	QueueCapacity int
	// Written counts events the sink acknowledged.
	Written uint64
	// FailedWrites counts WriteBatch calls that returned an error (each retry counts).
	FailedWrites uint64
	// Rejected counts Record calls that returned an error.
	Rejected uint64
	// Lost counts accepted events that were not written: Close ran out of time while the sink
	// was failing. Anything but 0 is an incident.
	Lost uint64
	// Undelivered counts blocking Records that stopped waiting for their write (the sink failed
	// for longer than the delivery timeout): those calls' answers were cut.
	Undelivered uint64
	// Healthy is false while the sink is failing.
	Healthy bool
	// ReserveBytes is what the writer may owe a sink that keeps a reserve (0: none), ReserveOwed
	// what it owes now (accepted events not yet written, slots of calls in flight), and
	// ReserveShort is set while the disk is full and the reserve is being drawn on.
	ReserveBytes, ReserveOwed int64
	ReserveShort              bool
	// LastError is the most recent sink error (kept after recovery) and when it happened.
	LastError     error
	LastErrorTime time.Time
}

// Stats returns the current counters.
func (w *Writer) Stats() Stats {
	s := Stats{
		QueueDepth:    len(w.queue),
		QueueCapacity: cap(w.queue),
		Written:       w.written.Load(),
		FailedWrites:  w.failed.Load(),
		Rejected:      w.rejected.Load(),
		Lost:          w.lost.Load(),
		Undelivered:   w.undelivered.Load(),
		Healthy:       w.Healthy() == nil,
		ReserveBytes:  w.reserve,
		ReserveOwed:   w.owed.Load(),
		ReserveShort:  w.short.Load(),
	}
	if f := w.lastErr.Load(); f != nil {
		s.LastError, s.LastErrorTime = f.err, f.time
	}
	return s
}

// Close stops accepting events, writes every queued event and closes the sink. If the sink keeps
// failing until ctx ends, Close gives up and returns an error saying how many accepted events
// were lost. Close is idempotent; later calls return nil.
func (w *Writer) Close(ctx context.Context) error {
	var err error
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		if w.fatal == nil {
			close(w.queue)
		}
		w.mu.Unlock()

		select {
		case <-w.done:
		case <-ctx.Done():
			close(w.abort)
			<-w.done
		}
		w.countUnwritten()
		if n := w.lost.Load(); n > 0 {
			err = fmt.Errorf("close audit writer: %d accepted events were not written: %w", n, w.Healthy())
		}
		if cerr := w.sink.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close audit sink: %w", cerr))
		}
	})
	return err
}

// write hands b to the sink, retrying with backoff while it fails. It returns false when Close
// gave up waiting; the batch's call events then count as lost.
func (w *Writer) write(b *Batch) bool {
	backoff := 10 * time.Millisecond
	w.writingSince.Store(time.Now().UnixNano())
	defer w.writingSince.Store(0)
	for {
		err := w.sink.WriteBatch(b)
		if err == nil {
			w.written.Add(uint64(len(b.Events)))
			var owed int64
			for i := range b.Events {
				owed += b.Events[i].owed
			}
			w.owed.Add(-owed)
			if !w.checkReserve() {
				w.failure.Store(nil)
			}
			// Last: a blocking Record told of its write finds the writer as the write left it
			// (healthy again after a failure, its counters up to date).
			acknowledge(b.Events, nil)
			return true
		}
		w.failed.Add(1)
		w.setFailure(fmt.Errorf("%w: write %d events: %w", ErrUnhealthy, len(b.Events), err))
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-w.abort:
			t.Stop()
			w.lost.Add(uint64(len(b.Events)))
			acknowledge(b.Events, fmt.Errorf("%w: the writer closed while the sink failed: %w", ErrNotDelivered, err))
			return false
		}
		backoff = min(2*backoff, w.retryMax)
	}
}

// checkReserve asks a sink with a reserve whether it is whole, and keeps the writer unhealthy
// while it is not: the disk is full and the reserve holds only what the writer already owes.
// It reports whether the reserve is short.
func (w *Writer) checkReserve() bool {
	r, ok := w.sink.(Reserver)
	if !ok {
		return false
	}
	err := r.Replenish()
	if err == nil {
		if w.short.Swap(false) {
			w.failure.Store(nil)
		}
		return false
	}
	w.short.Store(true)
	w.setFailure(fmt.Errorf("%w: the disk is full; the events of the calls already admitted are written from the reserve, new calls are refused until space is freed: %w", ErrUnhealthy, err))
	return true
}

func (w *Writer) setFailure(err error) {
	f := &failure{err: err, time: time.Now()}
	w.failure.Store(f)
	w.lastErr.Store(f)
}

// countUnwritten counts as lost what is still queued once the sequencer has exited. The queue
// is closed by then, except when the writer never started, and then nothing was queued.
func (w *Writer) countUnwritten() {
	for {
		select {
		case ev, ok := <-w.queue:
			if !ok {
				return
			}
			w.lost.Add(1)
			acknowledge([]Event{ev}, fmt.Errorf("%w: %w", ErrNotDelivered, ErrClosed))
		default:
			return
		}
	}
}
