package audit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/test/redistest"
)

// In a Redis Cluster the mirror's script touches the stream and the replica's marker, so the
// stream name carries a hash tag (the config's default there) that puts both in one slot.
func TestStreamMirrorAndQueryInARedisCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	dir := t.TempDir()
	const stream = "sg:{audit}"
	fs, err := OpenFileSink(FileConfig{Dir: dir, Fsync: FsyncNever})
	require.NoError(t, err)
	w := NewWriter(fs)
	for i := range 5 {
		ev := testEvent(i)
		require.NoError(t, w.Record(&ev))
	}
	require.NoError(t, w.Close(context.Background()))
	for _, source := range []string{"replica-a", "replica-b"} { // two replicas mirroring one log
		m, err := NewStreamMirror(client, StreamConfig{Dir: dir, Stream: stream, Source: source, Timeout: 2 * time.Second})
		require.NoError(t, err)
		require.NoError(t, m.Sync(ctxTimeout(t, 10*time.Second)))
	}
	res, err := QueryRedis(ctxTimeout(t, 10*time.Second), client, stream, Filter{Limit: -1})
	require.NoError(t, err)
	assert.Equal(t, fileIDs(t, dir), eventIDs(res.Events), "every event once, in time order")
}
