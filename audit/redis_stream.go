package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// CursorFile, in the audit folder, records how far the log has been mirrored to the Redis Stream.
const CursorFile = "redis-stream.cursor"

// Fields of a stream entry: the event ID (for de-duplication), its hash and the log line unchanged.
const (
	StreamFieldID   = "id"
	StreamFieldHash = "hash"
	StreamFieldLine = "line"
)

// StreamConfig configures a StreamMirror. Zero values take the defaults.
type StreamConfig struct {
	// Dir is the audit folder the FileSink writes (audit.file.dir).
	Dir string
	// Stream is the base name of the audit streams (redis.audit_stream.name): this replica
	// appends to ReplicaStream(Stream, Source) and lists it in RegistryKey(Stream).
	Stream string
	// Source names this replica, and so its stream (default: the host name, which is the pod name
	// in Kubernetes). Replicas must have different sources.
	Source string
	// MaxLen trims the stream to about this many entries with XADD MAXLEN ~ (default 1000000).
	MaxLen int64
	// Timeout bounds one batch sent to Redis (default 1s).
	Timeout time.Duration
	// Batch is the most lines sent in one round trip, and so what the mirror holds in memory
	// (default 256).
	Batch int
	// Poll is how often the log is looked at without a Notify (default 1s).
	Poll time.Duration
	// RetryBackoff caps the wait between attempts while Redis fails (default 5s).
	RetryBackoff time.Duration
}

func (c StreamConfig) withDefaults() StreamConfig {
	if c.MaxLen <= 0 {
		c.MaxLen = 1_000_000
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.Batch <= 0 {
		c.Batch = 256
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 5 * time.Second
	}
	if c.Source == "" {
		c.Source, _ = os.Hostname()
	}
	return c
}

// StreamMirror copies the audit log to a Redis Stream, line by line as the FileSink wrote it, so
// that the events of every replica can be queried in one place (QueryRedis).
//
// The file stays the source of truth and the mirror never stands in its way: it reads the files
// after they are written instead of sitting in the write path, so a Redis outage neither blocks nor
// fails a write, and memory stays at one batch however long Redis is away. After an outage, or a
// restart, the mirror continues from its cursor (CursorFile: file, byte range and hash of the last
// mirrored line), following rotations. A batch whose acknowledgement was lost (a timeout against a
// slow server that then ran it) is not appended twice: the server keeps the hash of each source's
// last mirrored line and skips what it already has. Only a lost or stale cursor file makes the
// mirror send lines again from an earlier point; every entry carries the event ID and QueryRedis
// drops such repeats.
type StreamMirror struct {
	client redis.UniversalClient
	cfg    StreamConfig
	stream string // ReplicaStream(cfg.Stream, cfg.Source)
	wake   chan struct{}
	// registered is when the stream was last added to the registry (guarded by mu).
	registered time.Time

	mu  sync.Mutex // serialises pumps (Run and Sync)
	pos position

	mirrored atomic.Uint64
	failure  atomic.Pointer[failure]
	restarts atomic.Uint64
}

// position is where the next line to mirror starts.
type position struct {
	path   string      // "" until located
	info   os.FileInfo // identifies the file across a rename by rotation
	offset int64
	start  int64  // of the last mirrored line in path, for the cursor
	hash   string // of the last mirrored line
	// located is set when the position was just found by its hash: the next line is then taken as
	// it is even if its prev_hash disagrees (a broken chain is Verify's to report, not a reason
	// to search forever).
	located bool
}

// NewStreamMirror returns a mirror of cfg.Dir's log into cfg.Stream. Start it with Run.
func NewStreamMirror(client redis.UniversalClient, cfg StreamConfig) (*StreamMirror, error) {
	cfg = cfg.withDefaults()
	if cfg.Dir == "" || cfg.Stream == "" {
		return nil, errors.New("audit stream mirror: Dir and Stream must be set")
	}
	return &StreamMirror{client: client, cfg: cfg, stream: ReplicaStream(cfg.Stream, cfg.Source), wake: make(chan struct{}, 1)}, nil
}

// Notify tells the mirror that lines were written. It never blocks.
func (m *StreamMirror) Notify() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run mirrors until ctx ends, retrying with backoff while Redis fails. It returns ctx's error.
func (m *StreamMirror) Run(ctx context.Context) error {
	poll := time.NewTicker(m.cfg.Poll)
	defer poll.Stop()
	backoff := 100 * time.Millisecond
	for {
		err := m.catchUp(ctx)
		wait := m.cfg.Poll
		if err != nil {
			wait, backoff = backoff, min(2*backoff, m.cfg.RetryBackoff)
		} else {
			backoff = 100 * time.Millisecond
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-m.wake:
		case <-poll.C:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// Sync mirrors everything written so far, retrying until it succeeds or ctx ends (call it at
// shutdown, after the Writer is closed, with a deadline).
func (m *StreamMirror) Sync(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		err := m.catchUp(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("audit stream mirror: %w (last error: %w)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, m.cfg.RetryBackoff)
	}
}

// Healthy returns nil while the mirror keeps up, and the last error while it cannot reach Redis
// (the file still has every event; the mirror catches up when Redis returns).
func (m *StreamMirror) Healthy() error {
	if f := m.failure.Load(); f != nil {
		return f.err
	}
	return nil
}

// StreamStats is a snapshot of the mirror's counters, for metrics.
type StreamStats struct {
	// Mirrored counts lines sent (repeats after a lost acknowledgement included).
	Mirrored uint64
	// Relocated counts times the cursor was not found and the mirror started over from the oldest
	// file (events may then appear twice in the stream; QueryRedis drops repeats).
	Relocated uint64
	LastError error
}

// Stats returns the mirror's counters.
func (m *StreamMirror) Stats() StreamStats {
	s := StreamStats{Mirrored: m.mirrored.Load(), Relocated: m.restarts.Load()}
	if f := m.failure.Load(); f != nil {
		s.LastError = f.err
	}
	return s
}

// catchUp pumps batches until the mirror has reached the end of the log.
func (m *StreamMirror) catchUp(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		done, err := m.pump(ctx)
		if err != nil {
			m.failure.Store(&failure{err: err, time: time.Now()})
			return err
		}
		if done {
			m.failure.Store(nil)
			return nil
		}
	}
}

// pump sends the next batch of complete lines, or moves on to the next file once a rotated file
// is finished. It reports done when nothing is left to send. Caller holds mu.
func (m *StreamMirror) pump(ctx context.Context) (done bool, err error) {
	files, err := logFiles(m.cfg.Dir)
	if err != nil {
		return false, err
	}
	if len(files) == 0 {
		return true, nil
	}
	idx := m.currentIndex(files)
	if idx < 0 {
		if err := m.locate(files); err != nil {
			return false, err
		}
		if idx = m.currentIndex(files); idx < 0 {
			return false, fmt.Errorf("audit stream mirror: lost track of %s", m.pos.path)
		}
	}
	m.pos.path = files[idx] // the file may have been renamed by rotation since
	lines, ends, _, err := readCompleteLines(m.pos.path, m.pos.info, m.pos.offset, m.cfg.Batch)
	if errors.Is(err, errMoved) {
		return false, nil // rotated between listing and opening: look again
	}
	if err != nil {
		return false, err
	}
	if len(lines) > 0 && m.pos.hash != "" && !m.pos.located && linePrevHash(lines[0]) != m.pos.hash {
		// The chain says this is not the line after the last one mirrored (a file skipped by
		// two quick rotations, or a log that was truncated): find that line by its hash.
		return false, m.locateHash(files, m.pos.hash)
	}
	if len(lines) == 0 {
		if idx == len(files)-1 {
			return true, nil
		}
		// A rotated file never grows again; a cut-off last line in it is skipped (Verify reports it).
		return false, m.openAt(files[idx+1], 0)
	}
	if err := m.send(ctx, lines); err != nil {
		return false, err
	}
	m.mirrored.Add(uint64(len(lines)))
	last := len(lines) - 1
	m.pos.start, m.pos.offset = ends[last]-int64(len(lines[last]))-1, ends[last]
	m.pos.hash, _ = storedHash(lines[last])
	m.pos.located = false
	m.saveCursor()
	return false, nil
}

// mirrorScript appends a batch to the replica's stream (KEYS[1]) unless its marker (KEYS[2], the
// hash of the last line it mirrored) shows that a prefix of it is there already: an attempt that
// timed out on the client may still have run on a slow server. ARGV: MAXLEN, marker TTL (ms), then
// id, hash and line of each line. Returns how many lines were appended and whether the marker was
// there (absent: a new stream, or a Redis that lost its data, whose registry must be told again).
var mirrorScript = redis.NewScript(`
local marker = redis.call('GET', KEYS[2])
local n = (#ARGV - 2) / 3
local from = 1
if marker then
  for i = n, 1, -1 do
    if ARGV[3 + 3*(i-1) + 1] == marker then from = i + 1; break end
  end
end
for i = from, n do
  local b = 3 + 3*(i-1)
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'id', ARGV[b], 'hash', ARGV[b+1], 'line', ARGV[b+2])
end
redis.call('SET', KEYS[2], ARGV[3 + 3*(n-1) + 1], 'PX', ARGV[2])
return {n - from + 1, marker and 1 or 0}
`)

// markerTTL is how long the server remembers a replica's last mirrored line.
const markerTTL = 7 * 24 * time.Hour

func (m *StreamMirror) send(ctx context.Context, lines [][]byte) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	args := make([]any, 0, 2+3*len(lines))
	args = append(args, m.cfg.MaxLen, markerTTL.Milliseconds())
	for _, l := range lines {
		hash, _ := storedHash(l)
		args = append(args, lineID(l), hash, l)
	}
	keys := []string{m.stream, m.stream + ":mirrored"}
	res, err := mirrorScript.Run(ctx, m.client, keys, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("audit stream mirror: XADD %d lines to %s: %w", len(lines), m.stream, err)
	}
	if len(res) == 2 && res[1] == 0 {
		m.registered = time.Time{} // the marker was gone: so may the registry be
	}
	return m.register(ctx)
}

// MirroredSink wraps the file sink so that each written batch wakes the mirror at once instead of
// at its next poll. Writes, their errors and the chain are the file sink's alone.
func MirroredSink(file Sink, m *StreamMirror) Sink { return &mirroredSink{Sink: file, mirror: m} }

type mirroredSink struct {
	Sink
	mirror *StreamMirror
}

func (s *mirroredSink) WriteBatch(b *Batch) error {
	if err := s.Sink.WriteBatch(b); err != nil {
		return err
	}
	s.mirror.Notify()
	return nil
}

// CountLines passes the file sink's count through (see LineCounter).
func (s *mirroredSink) CountLines() (uint64, error) {
	c, ok := s.Sink.(LineCounter)
	if !ok {
		return 0, fmt.Errorf("the sink (%T) cannot count its lines", s.Sink)
	}
	return c.CountLines()
}
