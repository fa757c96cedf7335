package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	// LeaseTTL is how long the stream's lease outlives the holder's last renewal (default 30s,
	// redis_lease.go): how long a replica of the same name from another folder waits after the
	// holder was killed.
	LeaseTTL time.Duration
}

func (c StreamConfig) withDefaults() StreamConfig {
	if c.MaxLen <= 0 {
		c.MaxLen = 1_000_000
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = defaultLeaseTTL
	}
	// Batch, Poll and RetryBackoff are the follower's, defaulted there (FollowerConfig).
	if c.Source == "" {
		c.Source, _ = os.Hostname()
	}
	return c
}

// StreamMirror copies the audit log to a Redis Stream, line by line as the FileSink wrote it, so
// that the events of every replica can be queried in one place (QueryRedis). It is a Follower of
// the file (see there: the file stays the source of truth, a Redis outage neither blocks nor fails
// a write, the mirror continues from its cursor, CursorFile, after an outage or a restart).
//
// A batch whose acknowledgement was lost (a timeout against a slow server that then ran it) is
// not appended twice: the server keeps the hash of each source's last mirrored line and skips
// what it already has. Only a lost or stale cursor file makes the mirror send lines again from an
// earlier point; every entry carries the event ID and QueryRedis drops such repeats.
type StreamMirror struct {
	*Follower
	client redis.UniversalClient
	cfg    StreamConfig
	stream string // ReplicaStream(cfg.Stream, cfg.Source)
	// registered is when the stream was last added to the registry (only Send, under the
	// follower's lock, touches it).
	registered time.Time
	// lease is the mirror's claim on its stream (redis_lease.go).
	lease streamLease
}

// NewStreamMirror returns a mirror of cfg.Dir's log into cfg.Stream. Start it with Run.
func NewStreamMirror(client redis.UniversalClient, cfg StreamConfig) (*StreamMirror, error) {
	cfg = cfg.withDefaults()
	if cfg.Dir == "" || cfg.Stream == "" {
		return nil, errors.New("audit stream mirror: Dir and Stream must be set")
	}
	m := &StreamMirror{client: client, cfg: cfg, stream: ReplicaStream(cfg.Stream, cfg.Source)}
	m.lease = streamLease{key: leaseKey(m.stream), ttl: cfg.LeaseTTL, dir: cfg.Dir}
	f, err := NewFollower(FollowerConfig{Dir: cfg.Dir, Name: "audit stream mirror", CursorFile: CursorFile,
		CursorTag: cfg.Stream, Batch: cfg.Batch, Poll: cfg.Poll, RetryBackoff: cfg.RetryBackoff}, m)
	if err != nil {
		return nil, err
	}
	m.Follower = f
	return m, nil
}

// StreamStats is a snapshot of the mirror's counters, for metrics.
type StreamStats = FollowerStats

// mirrorScript appends a batch to the replica's stream (KEYS[1]) unless its marker (KEYS[2], the
// hash of the last line it mirrored) shows that a prefix of it is there already: an attempt that
// timed out on the client may still have run on a slow server. It appends only under the
// stream's lease (KEYS[3], redis_lease.go), which it takes or renews first. ARGV: MAXLEN, marker
// TTL (ms), the lease's holder, its folder prefix and TTL (ms), then id, hash and line of each
// line. Returns how many lines were appended and whether the marker was there (absent: a new
// stream, or a Redis that lost its data, whose registry must be told again), or -1 and the
// holder of the lease when another folder holds it.
var mirrorScript = redis.NewScript(`
local lease = redis.call('GET', KEYS[3])
if lease and string.sub(lease, 1, #ARGV[4]) ~= ARGV[4] then return {-1, 0, lease} end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[5])
local marker = redis.call('GET', KEYS[2])
local n = (#ARGV - 5) / 3
local from = 1
if marker then
  for i = n, 1, -1 do
    if ARGV[6 + 3*(i-1) + 1] == marker then from = i + 1; break end
  end
end
for i = from, n do
  local b = 6 + 3*(i-1)
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'id', ARGV[b], 'hash', ARGV[b+1], 'line', ARGV[b+2])
end
redis.call('SET', KEYS[2], ARGV[6 + 3*(n-1) + 1], 'PX', ARGV[2])
return {n - from + 1, marker and 1 or 0, ''}
`)

// markerTTL is how long the server remembers a replica's last mirrored line.
const markerTTL = 7 * 24 * time.Hour

// Send appends lines to the replica's stream (the mirror's Destination).
func (m *StreamMirror) Send(ctx context.Context, lines [][]byte) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	args := make([]any, 0, 5+3*len(lines))
	args = append(args, m.cfg.MaxLen, markerTTL.Milliseconds())
	args = append(args, m.lease.args()...)
	for _, l := range lines {
		hash, _ := storedHash(l)
		args = append(args, lineID(l), hash, l)
	}
	keys := []string{m.stream, m.stream + ":mirrored", m.lease.key}
	res, err := mirrorScript.Run(ctx, m.client, keys, args...).Slice()
	if err != nil {
		return fmt.Errorf("audit stream mirror: XADD %d lines to %s: %w", len(lines), m.stream, err)
	}
	if len(res) != 3 {
		return fmt.Errorf("audit stream mirror: XADD %d lines to %s: the script answered %d values, not 3", len(lines), m.stream, len(res))
	}
	holder, _ := res[2].(string)
	if err := m.lease.refused(m.stream, holder); err != nil {
		return err
	}
	if marker, _ := res[1].(int64); marker == 0 {
		m.registered = time.Time{} // the marker was gone: so may the registry be
	}
	return m.register(ctx)
}

// MirroredSink wraps the file sink so that each written batch wakes the mirror at once instead of
// at its next poll (NotifyingSink).
func MirroredSink(file Sink, m *StreamMirror) Sink { return NotifyingSink(file, m.Follower) }
