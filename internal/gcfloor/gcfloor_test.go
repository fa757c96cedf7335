package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name        string
		live, floor uint64
		base, want  int
	}{
		{"a small heap grows to the floor", 8 * mib, 64 * mib, 100, 700},
		{"twice the live heap reaching the floor is the default", 32 * mib, 64 * mib, 100, 100},
		{"a large heap keeps the base", 200 * mib, 64 * mib, 100, 100},
		{"an empty heap is taken as 1 MiB", 0, 64 * mib, 100, 6300},
		{"the percent is bounded", 1 * mib, 1 << 40, 100, maxPercent},
		{"a base above the floor's need is kept", 8 * mib, 64 * mib, 900, 900},
		{"GOGC=off stays off", 8 * mib, 64 * mib, -1, -1},
		{"no floor keeps the base", 8 * mib, 0, 100, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Percent(tc.live, tc.floor, tc.base))
		})
	}
}

// readGC returns the runtime's GOGC and heap goal.
func readGC(t *testing.T) (percent, goal uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	require.Equal(t, metrics.KindUint64, s[0].Value.Kind())
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

type adjustment struct {
	percent int
	cycles  uint64 // the collections done when the tuner read the live heap
}

// collect runs a collection and waits until the tuner has adjusted from the live heap it left
// (adjustments after earlier collections, the runtime's own, are passed over).
func collect(t *testing.T, adjusted <-chan adjustment) int {
	t.Helper()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	done := s[0].Value.Uint64()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case a := <-adjusted:
			if a.cycles >= done {
				return a.percent
			}
		case <-timeout:
			t.Fatal("no adjustment after a collection")
			return 0
		}
	}
}

// A process with a small live heap gets a heap goal at the floor after its next collection,
// one whose live heap passes half the floor is back at the base, and Stop restores the base.
func TestTunerSetsTheGoalFromTheLiveHeap(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	const floor = 256 << 20
	adjusted := make(chan adjustment, 1024)
	tu := start(floor, 100, func(p int, cycles uint64) {
		select {
		case adjusted <- adjustment{p, cycles}:
		default: // a test that stopped reading
		}
	})
	t.Cleanup(tu.Stop)

	p := collect(t, adjusted)
	assert.Greater(t, p, 100, "this test's live heap is far below half of 256 MiB")
	percent, goal := readGC(t)
	assert.Equal(t, uint64(p), percent, "the runtime runs with the tuner's GOGC")
	assert.GreaterOrEqual(t, goal, uint64(floor)*9/10, "the heap goal is about the floor")
	assert.Equal(t, p, tu.Percent())

	// Live state past half the floor: the runtime's default again.
	held := make([][]byte, 0, 160)
	for range 160 {
		held = append(held, make([]byte, 1<<20))
	}
	p = collect(t, adjusted)
	assert.Equal(t, 100, p, "160 MiB live, 320 MiB at GOGC=100 passes the floor")
	percent, _ = readGC(t)
	assert.Equal(t, uint64(100), percent)
	runtime.KeepAlive(held)

	held = nil
	p = collect(t, adjusted)
	assert.Greater(t, p, 100, "the heap shrank below the floor again")

	tu.Stop()
	percent, _ = readGC(t)
	assert.Equal(t, uint64(100), percent, "Stop puts the base back")
	runtime.GC()
	percent, _ = readGC(t)
	assert.Equal(t, uint64(100), percent, "a stopped tuner adjusts nothing")
}
