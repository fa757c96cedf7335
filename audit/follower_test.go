package audit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// batchSizes is a Destination that reports the size of each Send.
type batchSizes chan int

func (d batchSizes) Send(_ context.Context, lines [][]byte) error {
	d <- len(lines)
	return nil
}

// TestFollowerLingersAfterANotify: lines written while the follower lingers after a Notify go
// out in the same Send as the line that woke it, not one Send per write.
func TestFollowerLingersAfterANotify(t *testing.T) {
	dir := t.TempDir()
	w := openWriter(t, FileConfig{Dir: dir, Fsync: FsyncNever})
	sends := make(batchSizes, 16)
	f, err := NewFollower(FollowerConfig{Dir: dir, CursorFile: "test.cursor", Poll: time.Hour, Linger: time.Minute}, sends)
	require.NoError(t, err)
	lingers := make(chan chan time.Time)
	f.after = func(time.Duration) <-chan time.Time {
		c := make(chan time.Time, 1)
		lingers <- c
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = f.Run(ctx) }()

	write := func(from, n int) {
		for i := from; i < from+n; i++ {
			ev := testEvent(i)
			require.NoError(t, w.Record(&ev))
		}
		require.Eventually(t, func() bool { return w.Stats().Written == uint64(from+n) }, 10*time.Second, time.Millisecond)
		f.Notify()
	}
	write(0, 1)
	linger := receive(t, lingers)
	write(1, 9)
	linger <- time.Now()
	assert.Equal(t, 10, receive(t, sends), "the line that woke the follower and the nine written while it lingered, in one Send")
	receive(t, lingers) // the second Notify: the follower is past its catch-up and lingers again
	assert.Empty(t, sends, "nothing was left to send")
}

// receive returns the next value of c, failing t when none comes in 10s.
func receive[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received in 10s")
	}
	var zero T
	return zero
}
