package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Destination receives the audit log's lines from a Follower: the Redis Stream mirror, the OTLP
// log exporter.
type Destination interface {
	// Send delivers lines (complete log lines as written, without their newline) in log order.
	// The lines are the Follower's until Send returns: a destination that keeps one copies it.
	// nil means the destination has every one of them; on an error the Follower sends the same
	// lines again later (so a destination sees a line at least once), and it never sends a line
	// before every line ahead of it has been accepted. Send bounds its own time.
	Send(ctx context.Context, lines [][]byte) error
}

// RejectedError is what a Destination's Send returns when the destination took the batch but
// refused some of its lines for good (an OTLP partial success). Sending them again would be
// refused again, and OTLP forbids retrying a partial success, so the Follower moves on: the
// lines stay in the file, the refused ones are counted (FollowerStats.Rejected) and reported
// (FollowerConfig.OnRejected). Lines may be 0: a warning that came with a full success.
type RejectedError struct {
	Lines  int64
	Reason string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("the destination refused %d lines for good: %q", e.Lines, e.Reason)
}

// ThrottledError is what a Destination's Send returns when the destination said when to try
// again (an OTLP/HTTP 429 or 503 with Retry-After, an OTLP/gRPC status with RetryInfo): the
// Follower waits that long before its next attempt, or its own back-off when that is longer,
// and at most MaxThrottle.
type ThrottledError struct {
	After time.Duration
	Err   error
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("%v (the destination asks to wait %s)", e.Err, e.After)
}

func (e *ThrottledError) Unwrap() error { return e.Err }

// MaxThrottle bounds the wait a destination can ask for (ThrottledError): a Collector that asks
// for a day is retried after five minutes, since the events wait in the file meanwhile.
const MaxThrottle = 5 * time.Minute

// firstBackoff is the wait after a failed attempt, doubled after each further failure up to
// FollowerConfig.RetryBackoff.
const firstBackoff = 100 * time.Millisecond

// FollowerConfig configures a Follower. Zero values take the defaults.
type FollowerConfig struct {
	// Dir is the audit folder the FileSink writes (audit.file.dir).
	Dir string
	// Name says which follower an error or a log line is about ("audit stream mirror").
	Name string
	// CursorFile, in Dir, records how far the log has been sent.
	CursorFile string
	// CursorTag is written into the cursor and must match when it is read back: a cursor written
	// for another destination (another stream name) is not this one's.
	CursorTag string
	// Batch is the most lines sent at once, and so what the follower holds in memory: the file is
	// its queue (default 256).
	Batch int
	// Poll is how often the log is looked at without a Notify (default 1s).
	Poll time.Duration
	// RetryBackoff caps the wait between attempts while the destination fails (default 5s).
	RetryBackoff time.Duration
	// Linger is how long the follower waits after a Notify before it reads the log, so that the
	// lines written meanwhile go out together: each Send has a fixed cost (for OTLP a request
	// and a cursor write), which under load, with a Notify per write, cost more than the lines.
	// 0 or less reads at once (the Redis mirror).
	Linger time.Duration
	// OnRejected, when set, is told of each batch the destination took with lines refused for
	// good (a *RejectedError), for a log line; it must not block.
	OnRejected func(error)
}

func (c FollowerConfig) withDefaults() FollowerConfig {
	if c.Batch <= 0 {
		c.Batch = 256
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 5 * time.Second
	}
	if c.Name == "" {
		c.Name = "audit follower"
	}
	return c
}

// Follower sends the audit log to a Destination, line by line as the FileSink wrote it.
//
// The file stays the source of truth and a follower never stands in its way: it reads the files
// after they are written instead of sitting in the write path, so a destination's outage neither
// blocks nor fails a write, and memory stays at one batch however long the destination is away.
// After an outage, or a restart, the follower continues from its cursor (file, byte range and
// hash of the last line sent), following rotations; the chain (each line's prev_hash) tells it
// when a file was skipped and it finds its place again by hash. Delivery is at least once: a
// batch whose acknowledgement was lost is sent again, and a lost or stale cursor makes the
// follower start again from the oldest file. The cursor is written when the follower has caught
// up (or stops), and at most every cursorSaveEvery while it catches up: a process killed
// mid-way sends again what it sent since. Every line carries its event ID for a consumer to
// drop repeats.
type Follower struct {
	cfg  FollowerConfig
	dest Destination
	wake chan struct{}
	// after makes Run's timers: the poll, the linger, the back-off (time.After; tests count and
	// fire them with their own); now tells when the cursor was last written (time.Now; tests
	// stop it).
	after func(time.Duration) <-chan time.Time
	now   func() time.Time

	mu    sync.Mutex // serialises pumps (Run and Sync)
	pos   position
	batch batchReader // the lines of the batch being sent
	// unsaved: the position moved since the cursor was last written (at savedAt).
	unsaved bool
	savedAt time.Time

	sent     atomic.Uint64
	failed   atomic.Uint64
	rejected atomic.Uint64
	restarts atomic.Uint64
	failure  atomic.Pointer[failure]
	// behind is the bytes of the log after the position, as of the last look; oldest is the
	// time (Unix ns) of the oldest line not yet sent, 0 when none is waiting.
	behind atomic.Int64
	oldest atomic.Int64
}

// NewFollower returns a follower of cfg.Dir's log into dest. Start it with Run.
func NewFollower(cfg FollowerConfig, dest Destination) (*Follower, error) {
	cfg = cfg.withDefaults()
	if cfg.Dir == "" || cfg.CursorFile == "" {
		return nil, fmt.Errorf("%s: Dir and CursorFile must be set", cfg.Name)
	}
	return &Follower{cfg: cfg, dest: dest, wake: make(chan struct{}, 1), after: time.After, now: time.Now}, nil
}

// Notify tells the follower that lines were written. It never blocks.
func (f *Follower) Notify() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run follows the log until ctx ends, retrying with back-off while the destination fails. It
// returns ctx's error.
//
// After a failed attempt only the back-off's end (or ctx's) starts the next one: neither a new
// write (Notify) nor the poll cuts it short, so a failing destination gets one attempt per
// back-off step (firstBackoff, doubling up to RetryBackoff, or what it asked for: ThrottledError),
// not one per write or per second.
func (f *Follower) Run(ctx context.Context) error {
	backoff := firstBackoff
	for {
		if err := f.catchUp(ctx); err != nil {
			wait := retryWait(err, backoff)
			backoff = min(2*backoff, f.cfg.RetryBackoff)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-f.after(wait):
			}
			continue
		}
		backoff = firstBackoff
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.wake:
			if err := f.linger(ctx); err != nil {
				return err
			}
		case <-f.after(f.cfg.Poll):
		}
	}
}

// retryWait is the wait after an attempt that failed with err: the back-off step, or what the
// destination asked for when that is longer (at most MaxThrottle).
func retryWait(err error, backoff time.Duration) time.Duration {
	var throttled *ThrottledError
	if errors.As(err, &throttled) {
		return max(backoff, min(throttled.After, MaxThrottle))
	}
	return backoff
}

// linger waits cfg.Linger after a wake, or until ctx ends (its error).
func (f *Follower) linger(ctx context.Context) error {
	if f.cfg.Linger <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-f.after(f.cfg.Linger):
		return nil
	}
}

// Sync sends everything written so far, retrying until it succeeds or ctx ends (call it at
// shutdown, after the Writer is closed, with a deadline).
func (f *Follower) Sync(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		err := f.catchUp(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %w)", f.cfg.Name, ctx.Err(), err)
		case <-time.After(retryWait(err, backoff)):
		}
		backoff = min(2*backoff, f.cfg.RetryBackoff)
	}
}

// Healthy returns nil while the follower keeps up, and the last error while it cannot deliver
// (the file still has every event; the follower catches up when the destination returns).
func (f *Follower) Healthy() error {
	if fl := f.failure.Load(); fl != nil {
		return fl.err
	}
	return nil
}

// FollowerStats is a snapshot of a follower's counters, for metrics.
type FollowerStats struct {
	// Sent counts lines the destination accepted (repeats after a lost acknowledgement included).
	Sent uint64
	// Failed counts lines in attempts that failed (each retry of a line counts again).
	Failed uint64
	// Rejected counts lines the destination refused for good (see RejectedError); they are not
	// sent again, and not counted in Sent.
	Rejected uint64
	// Relocated counts times the cursor was not found and the follower started over from the
	// oldest file (events may then be sent twice).
	Relocated uint64
	// BehindBytes is how much of the log is not sent yet, as of the follower's last look.
	BehindBytes int64
	// Oldest is the time of the oldest line not sent yet (zero when none is waiting).
	Oldest    time.Time
	LastError error
}

// Stats returns the follower's counters.
func (f *Follower) Stats() FollowerStats {
	s := FollowerStats{Sent: f.sent.Load(), Failed: f.failed.Load(), Rejected: f.rejected.Load(), Relocated: f.restarts.Load(),
		BehindBytes: f.behind.Load()}
	if ns := f.oldest.Load(); ns != 0 {
		s.Oldest = time.Unix(0, ns)
	}
	if fl := f.failure.Load(); fl != nil {
		s.LastError = fl.err
	}
	return s
}

// catchUp pumps batches until the follower has reached the end of the log.
func (f *Follower) catchUp(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.saveUnsaved()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		done, err := f.pump(ctx)
		if err != nil {
			f.failure.Store(&failure{err: err, time: time.Now()})
			return err
		}
		if done {
			f.failure.Store(nil)
			f.oldest.Store(0)
			return nil
		}
	}
}

// pump sends the next batch of complete lines, or moves on to the next file once a rotated file
// is finished. It reports done when nothing is left to send. Caller holds mu.
func (f *Follower) pump(ctx context.Context) (done bool, err error) {
	files, err := logFiles(f.cfg.Dir)
	if err != nil {
		return false, err
	}
	if len(files) == 0 {
		return true, nil
	}
	idx := f.currentIndex(files)
	if idx < 0 {
		if err := f.locate(files); err != nil {
			return false, err
		}
		if idx = f.currentIndex(files); idx < 0 {
			return false, fmt.Errorf("%s: lost track of %s", f.cfg.Name, f.pos.path)
		}
	}
	f.pos.path = files[idx] // the file may have been renamed by rotation since
	f.behind.Store(bytesAfter(files[idx:], f.pos.offset))
	lines, ends, _, err := f.batch.read(f.pos.path, f.pos.info, f.pos.offset, f.cfg.Batch)
	if errors.Is(err, errMoved) {
		return false, nil // rotated between listing and opening: look again
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w", f.cfg.Name, err)
	}
	if len(lines) > 0 && f.pos.hash != "" && !f.pos.located && linePrevHash(lines[0]) != f.pos.hash {
		// The chain says this is not the line after the last one sent (a file skipped by two
		// quick rotations, or a log that was truncated): find that line by its hash.
		return false, f.locateHash(files, f.pos.hash)
	}
	if len(lines) == 0 {
		if idx == len(files)-1 {
			return true, nil
		}
		// A rotated file never grows again; a cut-off last line in it is skipped (Verify reports it).
		return false, f.openAt(files[idx+1], 0)
	}
	if f.oldest.Load() == 0 {
		if t, ok := lineTime(lines[0]); ok {
			f.oldest.Store(t.UnixNano())
		}
	}
	err = f.dest.Send(ctx, lines)
	var rejected *RejectedError
	switch {
	case errors.As(err, &rejected):
		n := uint64(min(max(rejected.Lines, 0), int64(len(lines))))
		f.rejected.Add(n)
		f.sent.Add(uint64(len(lines)) - n)
		if f.cfg.OnRejected != nil {
			f.cfg.OnRejected(err)
		}
	case err != nil:
		f.failed.Add(uint64(len(lines)))
		return false, err
	default:
		f.sent.Add(uint64(len(lines)))
	}
	last := len(lines) - 1
	f.pos.start, f.pos.offset = ends[last]-int64(len(lines[last]))-1, ends[last]
	f.pos.hash, _ = storedHash(lines[last])
	f.pos.located = false
	f.oldest.Store(0) // the next batch's first line is the oldest waiting, if there is one
	f.unsaved = true
	if f.now().Sub(f.savedAt) >= cursorSaveEvery {
		f.saveCursor()
	}
	return false, nil
}

// bytesAfter is the size of files (the current file first) past offset in the first.
func bytesAfter(files []string, offset int64) int64 {
	var n int64
	for i, p := range files {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		n += fi.Size()
		if i == 0 {
			n -= min(offset, fi.Size())
		}
	}
	return n
}

// NotifyingSink wraps the file sink so that each written batch wakes the followers at once
// instead of at their next poll. Writes, their errors and the chain are the file sink's alone.
func NotifyingSink(file Sink, followers ...*Follower) Sink {
	if len(followers) == 0 {
		return file
	}
	return &notifyingSink{Sink: file, followers: followers}
}

type notifyingSink struct {
	Sink
	followers []*Follower
}

func (s *notifyingSink) WriteBatch(b *Batch) error {
	if err := s.Sink.WriteBatch(b); err != nil {
		return err
	}
	for _, f := range s.followers {
		f.Notify()
	}
	return nil
}

// CountLines passes the file sink's count through (see LineCounter).
func (s *notifyingSink) CountLines() (uint64, error) {
	c, ok := s.Sink.(LineCounter)
	if !ok {
		return 0, fmt.Errorf("the sink (%T) cannot count its lines", s.Sink)
	}
	return c.CountLines()
}
