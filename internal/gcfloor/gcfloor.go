// Package gcfloor keeps the Go collector from running more often than a heap of a given size
// needs: a heap floor.
//
// With GOGC=100 the runtime collects each time the heap has grown by as much as was live after
// the last collection. A gateway serving a few hundred sandboxes holds about 10 MB of live
// state and allocates 13–38 KB per request, so it collected every few hundred requests and
// spent a tenth of its CPU marking the same small live heap over and over. Raising GOGC for
// good would multiply the memory of a large replica too (40 KB of live state per sandbox at
// 10,000 sandboxes). The floor raises it only while the live heap is small: after each
// collection the next goal becomes about max(2 × live, floor). Once twice the live heap passes
// the floor, GOGC is back at its base and nothing differs from the runtime's default.
//
// Go's soft memory limit (GOMEMLIMIT, or the 90% of the container's that serve sets) still
// caps the goal: near the limit the collector runs earlier whatever the floor says.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// DefaultFloor is the heap goal below which a replica does not collect: 64 MiB, a quarter of
// the memory the chart requests for a replica (256 MiB).
const DefaultFloor = 64 << 20

// maxPercent bounds the GOGC the floor sets, for a heap that is almost empty (a process that
// just started): the goal is floor-sized either way.
const maxPercent = 10000

// Percent is the GOGC that makes the next heap goal about max(live × (1 + base/100), floor):
// base while that product reaches the floor, more below it.
func Percent(live, floor uint64, base int) int {
	live = max(live, 1<<20) // the goal of an empty heap is the floor: no division by ~0
	if base < 0 || floor <= live+live*uint64(base)/100 {
		return base
	}
	return int(min((floor-live)*100/live, maxPercent))
}

// Tuner sets GOGC after every collection from the live heap it left.
type Tuner struct {
	floor uint64
	base  int

	mu       sync.Mutex
	stopped  bool
	percent  int
	adjusted func(percent int, cycles uint64) // tests: called after each adjustment
	sample   [2]metrics.Sample
}

// Start begins tuning toward floor bytes; base is the GOGC above the floor (the runtime's
// own: 100). The first adjustment follows the next collection. Stop restores base.
func Start(floor uint64, base int) *Tuner {
	return start(floor, base, nil)
}

func start(floor uint64, base int, adjusted func(percent int, cycles uint64)) *Tuner {
	t := &Tuner{floor: floor, base: base, percent: base, adjusted: adjusted}
	t.sample[0].Name = "/gc/heap/live:bytes"
	t.sample[1].Name = "/gc/cycles/total:gc-cycles" // the collection the live heap is from
	t.arm()
	return t
}

// sentinel is garbage whose finalizer runs once per collection: it holds a pointer, so the
// runtime's tiny allocator (whose blocks may never be finalized) does not take it.
type sentinel struct{ t *Tuner }

// arm makes a sentinel for the next collection to find unreachable.
func (t *Tuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) { s.t.collected() })
}

// collected runs on the finalizer goroutine after a collection: it sets GOGC for the next one
// and arms again.
func (t *Tuner) collected() {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	metrics.Read(t.sample[:])
	p := t.base
	if s := t.sample[0]; s.Value.Kind() == metrics.KindUint64 {
		p = Percent(s.Value.Uint64(), t.floor, t.base)
	}
	if p != t.percent {
		debug.SetGCPercent(p)
		t.percent = p
	}
	adjusted, cycles := t.adjusted, t.sample[1].Value
	t.mu.Unlock()
	t.arm()
	if adjusted != nil && cycles.Kind() == metrics.KindUint64 {
		adjusted(p, cycles.Uint64())
	}
}

// Percent is the GOGC the tuner set last.
func (t *Tuner) Percent() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.percent
}

// Stop ends the tuning and puts GOGC back at its base.
func (t *Tuner) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	if t.percent != t.base {
		debug.SetGCPercent(t.base)
		t.percent = t.base
	}
}
