//go:build linux

package policy

import (
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// BenchArm is one arm of Interleave: a name and one operation (it reports success).
type BenchArm struct {
	Name string
	Op   func() bool
}

// Interleave gives every arm a turn of interleaveTurn ops per iteration, starting with a
// different arm each time, and reports each arm's CPU per op and, for every arm but the first
// (the floor), its ratio to the first: x-FIRST for the arm named "shipped", NAME-x-FIRST for
// the others.
func Interleave(b *testing.B, arms []BenchArm) {
	spent := make([]time.Duration, len(arms))
	i := 0
	for b.Loop() {
		for j := range arms {
			k := (i + j) % len(arms)
			t := processCPU(b)
			for range interleaveTurn {
				arms[k].Op()
			}
			spent[k] += processCPU(b) - t
		}
		i++
	}
	ops := float64(b.N * interleaveTurn)
	for k, a := range arms {
		b.ReportMetric(float64(spent[k].Nanoseconds())/ops, a.Name+"-cpu-ns/op")
		if k == 0 {
			continue
		}
		unit := a.Name + "-x-" + arms[0].Name
		if a.Name == "shipped" {
			unit = "x-" + arms[0].Name
		}
		b.ReportMetric(float64(spent[k])/float64(spent[0]), unit)
	}
}

// interleaveTurn ops per turn make the clock's own cost (a system call, under a microsecond)
// small against the ops it times, and the turns short enough to alternate many times a second.
const interleaveTurn = 8

// processCPU is the CPU time used by the whole process so far.
func processCPU(b *testing.B) time.Duration {
	var ts syscall.Timespec
	const clockProcessCPUTime = 2 // CLOCK_PROCESS_CPUTIME_ID
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockProcessCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		b.Fatalf("clock_gettime: %v", errno)
	}
	return time.Duration(ts.Nano())
}
