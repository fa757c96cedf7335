package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/redisconn"
	"github.com/sandgate/sandgate/test/redistest"
)

// Each replica mirrors its own log to its own stream; QueryRedis merges them. On a Cluster the
// streams carry the replica's name as hash tag, so they spread over the shards.
func TestEachReplicaMirrorsToItsOwnStreamAndQueryMergesThemInARedisCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := cluster.Client(t)
	checkReplicaStreams(t, client)
	slots := map[int64]bool{}
	for i := range 3 {
		slot, err := client.ClusterKeySlot(context.Background(), ReplicaStream("sg:{audit}", fmt.Sprintf("replica-%d", i))).Result()
		require.NoError(t, err)
		slots[slot] = true
	}
	assert.Len(t, slots, 3, "the replicas' streams hash by replica name, not by the base name's tag")
}

func TestEachReplicaMirrorsToItsOwnStreamOverTLS(t *testing.T) {
	srv, files := redistest.StartTLS(t)
	client, err := redisconn.New(config.Redis{Addr: srv.Addr, TLS: &config.RedisTLS{CAFile: files.CA},
		DialTimeout: config.Duration(2 * time.Second), OpTimeout: config.Duration(2 * time.Second)}, redisconn.Passwords{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	checkReplicaStreams(t, client)
}

// checkReplicaStreams has three replicas write interleaved events to their own logs and mirror
// them (one of them twice, its cursor lost, so its stream holds every line twice), then checks
// that QueryRedis returns every event of the three files once, in time order.
func checkReplicaStreams(t *testing.T, client redis.UniversalClient) {
	t.Helper()
	const stream = "sg:{audit}"
	var dirs []string
	var writers []*Writer
	for range 3 {
		dir := t.TempDir()
		fs, err := OpenFileSink(FileConfig{Dir: dir, Fsync: FsyncNever})
		require.NoError(t, err)
		dirs, writers = append(dirs, dir), append(writers, NewWriter(fs))
	}
	for i := range 30 {
		ev := testEvent(i)
		require.NoError(t, writers[i%3].Record(&ev))
	}
	var want []Event
	for i, w := range writers {
		require.NoError(t, w.Close(context.Background()))
		res, err := Query(context.Background(), dirs[i], Filter{Limit: -1})
		require.NoError(t, err)
		want = append(want, res.Events...)
		mirror := func() {
			m, err := NewStreamMirror(client, StreamConfig{Dir: dirs[i], Stream: stream, Source: fmt.Sprintf("replica-%d", i), Timeout: 2 * time.Second})
			require.NoError(t, err)
			require.NoError(t, m.Sync(ctxTimeout(t, 10*time.Second)))
		}
		mirror()
		if i == 0 {
			require.NoError(t, os.Remove(filepath.Join(dirs[i], CursorFile)))
			require.NoError(t, client.Del(context.Background(), ReplicaStream(stream, "replica-0")+":mirrored").Err())
			mirror()
		}
	}
	sort.SliceStable(want, func(i, j int) bool { return want[i].Time.Before(want[j].Time) })

	streams, err := Streams(context.Background(), client, stream)
	require.NoError(t, err)
	assert.Equal(t, []string{"sg:audit:{replica-0}", "sg:audit:{replica-1}", "sg:audit:{replica-2}", stream}, streams)
	n, err := client.XLen(context.Background(), "sg:audit:{replica-0}").Result()
	require.NoError(t, err)
	require.Equal(t, int64(20), n, "replica-0's lines are in its stream twice")

	res, err := QueryRedis(ctxTimeout(t, 10*time.Second), client, stream, Filter{Limit: -1})
	require.NoError(t, err)
	assert.Equal(t, eventIDs(want), eventIDs(res.Events), "every event of the three logs once, in time order")
	res, err = QueryRedis(ctxTimeout(t, 10*time.Second), client, stream, Filter{Limit: 4})
	require.NoError(t, err)
	assert.Equal(t, eventIDs(want[26:]), eventIDs(res.Events), "the newest 4 over all replicas")
}
