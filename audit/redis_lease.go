package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A replica's stream has one writer, as its audit folder has (lock.go): two processes that
// mirror under one replica name (two `make run` on one host, which both default to the host
// name) would interleave two chains in one stream, and each one's retry marker would make the
// other append its batches twice. So the mirror appends only while it holds the stream's lease,
// NAME:{REPLICA}:writer, checked and renewed in the same script that appends (atomic in Redis),
// and renewed every LeaseTTL/3 while the log is quiet. The lease is held by the audit folder (the
// lock file's Folder), not the process: a replica restarted over its folder, after a crash
// that left the lease behind, continues its stream at once, while another folder mirroring
// under the same name waits (its mirror degraded, naming the holder) until the lease is
// released (the holder's mirror stops) or runs out (LeaseTTL after the holder died). Its events
// stay in its own file. The replica is not refused at start, unlike a second writer of a
// folder: Redis trouble never makes a replica unready, and a stream is a copy, not the log.

// defaultLeaseTTL is how long a stream's lease outlives its holder's last renewal.
const defaultLeaseTTL = 30 * time.Second

// leaseKey is the key of the lease of a replica's stream (in the stream's hash slot).
func leaseKey(stream string) string { return stream + ":writer" }

// StreamTakenError is what a mirror reports while another audit folder holds its stream.
type StreamTakenError struct {
	Stream string
	Holder string // as the holder described itself
}

func (e *StreamTakenError) Error() string {
	return fmt.Sprintf("audit stream mirror: %s is mirrored by another Sandgate (%s): two replicas share one "+
		"replica name, and one stream has one writer. Give each its own (SANDGATE_REPLICA, else POD_NAME, else "+
		"the host name); this replica's events stay in its audit file, and are mirrored once the stream is free",
		e.Stream, e.Holder)
}

// leaseScript takes or renews the lease KEYS[1] for ARGV[1] (the holder: its folder, a space,
// its description) unless another folder holds it (ARGV[2]: that folder and a space), for ARGV[3]
// ms; ARGV[4] "release" deletes it instead when it is this folder's. Returns "" or the holder.
var leaseScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #ARGV[2]) ~= ARGV[2] then return cur end
if ARGV[4] == 'release' then
  if cur then redis.call('DEL', KEYS[1]) end
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
end
return ''
`)

// streamLease is a mirror's claim on its stream.
type streamLease struct {
	key string
	ttl time.Duration
	dir string

	once   sync.Once
	value  string // the folder, a space, this process's description
	prefix string // the folder and a space
	err    error  // the last attempt's refusal (a *StreamTakenError), nil while held
	mu     sync.Mutex
}

// ident reads the folder's name from its lock file, once: the sink wrote it when it took the
// folder, before the mirror runs. A folder never locked (a log copied from elsewhere) gets a
// name of this process's own.
func (l *streamLease) ident() {
	l.once.Do(func() {
		folder := ""
		if f, err := os.Open(filepath.Join(l.dir, LockFile)); err == nil {
			if h := readHolder(f); h != nil {
				folder = h.Folder
			}
			f.Close()
		}
		if folder == "" {
			var id [12]byte
			_, _ = rand.Read(id[:])
			folder = "process-" + hex.EncodeToString(id[:])
		}
		host, _ := os.Hostname()
		l.prefix = folder + " "
		l.value = l.prefix + fmt.Sprintf("pid %d on host %s, since %s, audit folder %s", os.Getpid(), host,
			time.Now().UTC().Format(time.RFC3339), l.dir)
	})
}

// args are the lease's arguments to the append script (mirrorScript).
func (l *streamLease) args() []any {
	l.ident()
	return []any{l.value, l.prefix, l.ttl.Milliseconds()}
}

// refused records the answer of a script that checked the lease: holder is "" when it is held.
func (l *streamLease) refused(stream, holder string) error {
	var err error
	if holder != "" {
		_, desc, _ := strings.Cut(holder, " ")
		err = &StreamTakenError{Stream: stream, Holder: desc}
	}
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
	return err
}

// held is nil while the lease is held (or has not been asked for yet), else why not.
func (l *streamLease) held() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// renew takes or renews the lease, or releases it.
func (m *StreamMirror) renew(ctx context.Context, release bool) error {
	l := &m.lease
	l.ident()
	op := "renew"
	if release {
		op = "release"
	}
	holder, err := leaseScript.Run(ctx, m.client, []string{l.key}, l.value, l.prefix, l.ttl.Milliseconds(), op).Text()
	if err != nil {
		return fmt.Errorf("audit stream mirror: %s the lease of %s: %w", op, m.stream, err)
	}
	return l.refused(m.stream, holder)
}

// Run mirrors the log until ctx ends (Follower.Run), holding the stream's lease meanwhile, and
// releases the lease as it returns, so that another replica of that name need not wait it out.
func (m *StreamMirror) Run(ctx context.Context) error {
	keepCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { m.keepLease(keepCtx) })
	err := m.Follower.Run(ctx)
	stop()
	wg.Wait()
	releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Timeout)
	defer cancel()
	_ = m.Release(releaseCtx)
	return err
}

// keepLease renews the lease every third of its TTL while the log is quiet (each append renews
// it too).
func (m *StreamMirror) keepLease(ctx context.Context) {
	t := time.NewTicker(m.lease.ttl / 3)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
		_ = m.renew(rctx, false)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Healthy is nil while the mirror keeps up and holds its stream; otherwise why not.
func (m *StreamMirror) Healthy() error {
	if err := m.lease.held(); err != nil {
		return err
	}
	return m.Follower.Healthy()
}

// Release gives the stream's lease up, if this folder holds it: at shutdown, after the last
// Sync, so that a replica of the same name need not wait for it to run out.
func (m *StreamMirror) Release(ctx context.Context) error {
	return m.renew(ctx, true)
}
