package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/test/redistest"
)

// requireOneChain checks that the replica stream's entries form one chain: each line's
// prev_hash is the hash of the entry before it.
func requireOneChain(t *testing.T, c *redis.Client) {
	t.Helper()
	msgs, err := c.XRange(context.Background(), testReplicaStream, "-", "+").Result()
	require.NoError(t, err)
	prev := ""
	for i, m := range msgs {
		line, _ := m.Values[StreamFieldLine].(string)
		p, stored, err := linkedHashes([]byte(line))
		require.NoError(t, err)
		if i > 0 {
			require.Equal(t, prev, p, "entry %d continues the entry before it", i)
		}
		prev = stored
	}
}

func folderName(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, LockFile))
	require.NoError(t, err)
	defer f.Close()
	h := readHolder(f)
	require.NotNil(t, h)
	require.NotEmpty(t, h.Folder)
	return h.Folder
}

// TestOneStreamHasOneWriter: two replicas that mirror under one name (two folders, one
// replica name) never interleave their chains in the stream: the second one's mirror waits,
// unhealthy and naming the holder, while its events stay in its file; it takes the stream once
// the holder lets it go (a clean stop) or its lease runs out (the holder killed). A restart over
// the holder's own folder continues the stream at once, whatever lease its dead predecessor left.
func TestOneStreamHasOneWriter(t *testing.T) {
	srv := redistest.Start(t)
	first := newMirrorRig(t, srv, FileConfig{}, StreamConfig{})
	first.write(t, 1)
	require.NoError(t, first.mirror.Sync(ctxTimeout(t, 10*time.Second)), "the first replica holds the stream")
	second := newMirrorRig(t, srv, FileConfig{}, StreamConfig{})
	for range 4 {
		first.write(t, 3)
		second.write(t, 3)
	}
	require.NoError(t, first.mirror.Sync(ctxTimeout(t, 10*time.Second)))
	var taken *StreamTakenError
	require.Eventually(t, func() bool { return errors.As(second.mirror.Healthy(), &taken) }, 10*time.Second, 5*time.Millisecond,
		"the second mirror reports the stream taken")
	assert.Contains(t, taken.Error(), fmt.Sprintf("pid %d on host", os.Getpid()))
	assert.Contains(t, taken.Error(), first.dir, "the refusal names the holder's audit folder")
	assert.Contains(t, taken.Error(), "SANDGATE_REPLICA", "and says what to do")
	assert.Equal(t, fileIDs(t, first.dir), streamIDs(t, first.client), "only the holder's events, in its order")
	requireOneChain(t, first.client)

	// The holder stops cleanly: its lease goes with it, and the second replica mirrors its own
	// log after the first's, not into it.
	first.stop()
	want := append(fileIDs(t, first.dir), fileIDs(t, second.dir)...)
	require.Eventually(t, func() bool { return fmt.Sprint(streamIDs(t, second.client)) == fmt.Sprint(want) }, 10*time.Second, 5*time.Millisecond,
		"the second replica takes the stream once the holder let it go")
	require.NoError(t, second.mirror.Sync(ctxTimeout(t, 10*time.Second)))
	assert.NoError(t, second.mirror.Healthy())

	ctx := context.Background()
	lease := leaseKey(testReplicaStream)
	t.Run("a restart over the holder's folder continues at once", func(t *testing.T) {
		// The process that held it was killed: its lease is left, under its folder's name.
		second.stop()
		dead := folderName(t, second.dir) + " pid 999999 on host gone, since 2026-01-01T00:00:00Z, audit folder " + second.dir
		require.NoError(t, second.client.Set(ctx, lease, dead, time.Hour).Err())
		restarted, err := NewStreamMirror(second.client, StreamConfig{Dir: second.dir, Stream: testStream, Source: testSource,
			Poll: 50 * time.Millisecond, RetryBackoff: 200 * time.Millisecond})
		require.NoError(t, err)
		second.write(t, 2)
		require.NoError(t, restarted.Sync(ctxTimeout(t, 10*time.Second)), "mirrored without waiting for the lease")
		assert.Equal(t, fmt.Sprint(append(fileIDs(t, first.dir), fileIDs(t, second.dir)...)), fmt.Sprint(streamIDs(t, second.client)))
		require.NoError(t, restarted.Release(ctx))
	})
	t.Run("another folder waits until a killed holder's lease runs out", func(t *testing.T) {
		require.NoError(t, second.client.Set(ctx, lease, "other-folder pid 4242 on host elsewhere, since 2026-01-01T00:00:00Z, audit folder /x",
			0).Err())
		m, err := NewStreamMirror(second.client, StreamConfig{Dir: second.dir, Stream: testStream, Source: testSource})
		require.NoError(t, err)
		second.write(t, 1)
		err = m.Sync(ctxTimeout(t, 100*time.Millisecond))
		require.ErrorAs(t, err, &taken, "refused while the lease lives")
		assert.Contains(t, err.Error(), "pid 4242 on host elsewhere")
		require.NoError(t, second.client.PExpire(ctx, lease, time.Millisecond).Err()) // it runs out
		require.NoError(t, m.Sync(ctxTimeout(t, 20*time.Second)), "taken once it ran out")
		assert.NoError(t, m.Healthy())
		assert.Equal(t, fmt.Sprint(append(fileIDs(t, first.dir), fileIDs(t, second.dir)...)), fmt.Sprint(streamIDs(t, second.client)),
			"each folder's events in one run, in its own order")
	})
}
