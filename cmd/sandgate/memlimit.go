package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/internal/gcfloor"
)

// containerMemoryEnv carries the container's memory limit in bytes; the chart sets it from the
// downward API (resources.limits.memory).
const containerMemoryEnv = "SANDGATE_CONTAINER_MEMORY"

// softMemoryLimit is the Go runtime's soft memory limit for a container of memory bytes: 90%.
// The runtime counts its own memory only (heap, stacks, its metadata), and the collector
// overshoots a little under a burst of allocation; the tenth left over keeps a busy replica
// from being OOM-killed at the container's hard limit.
func softMemoryLimit(memory int64) int64 { return memory / 10 * 9 }

// memoryLimitFromEnv returns the soft memory limit serve sets, or 0 to leave the runtime's
// default: when GOMEMLIMIT is set (the runtime has already applied it) or the container's
// memory is unknown.
func memoryLimitFromEnv(getenv func(string) string) (int64, error) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	v := strings.TrimSpace(getenv(containerMemoryEnv))
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q: want the container's memory limit in bytes", containerMemoryEnv, v)
	}
	return softMemoryLimit(n), nil
}

// heapFloorEnv sets the heap floor in bytes (internal/gcfloor); 0 turns it off.
const heapFloorEnv = "SANDGATE_GC_HEAP_FLOOR"

// heapFloorFromEnv returns the heap floor serve keeps, or 0 for none: none when GOGC is set
// (whoever set it chose the collector's pace), else $SANDGATE_GC_HEAP_FLOOR, else
// gcfloor.DefaultFloor. softLimit is Go's soft memory limit (0: none): the floor is at most a
// quarter of it, so that a replica near its limit still collects at the runtime's own pace.
func heapFloorFromEnv(getenv func(string) string, softLimit int64) (uint64, error) {
	if getenv("GOGC") != "" {
		return 0, nil
	}
	floor := uint64(gcfloor.DefaultFloor)
	if v := strings.TrimSpace(getenv(heapFloorEnv)); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s=%q: want the heap floor in bytes (0 turns it off)", heapFloorEnv, v)
		}
		floor = n
	}
	if softLimit > 0 {
		floor = min(floor, uint64(softLimit)/4)
	}
	return floor, nil
}
