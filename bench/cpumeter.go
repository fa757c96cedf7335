package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU time is read from the most precise source the machine offers, in this order:
//
//  1. a cgroup of its own per process (cgroup v1 cpuacct.usage, or v2 cpu.stat usage_usec):
//     nanoseconds (v1) or microseconds (v2), counting every thread and child, including those
//     that exited during the window; needs root, which the bench machines give;
//  2. the sum of /proc/PID/task/*/schedstat over the process group (nanoseconds of run time
//     per live thread; a thread that exits mid-window loses its share, which a Go process,
//     whose threads live as long as it does, does not hit);
//  3. /proc/PID/stat utime+stime in 10 ms ticks (the old source: a 2 s window at 10 µs per
//     request over 30,000 requests is 30 ticks, ±3%).
//
// The load generator measures itself with getrusage(RUSAGE_SELF), which Linux computes from
// the same nanosecond run time (sum_exec_runtime), so its precision matches.

// cpuSource names the source a meter reads.
type cpuSource string

const (
	srcCgroupV1  cpuSource = "cgroup v1 cpuacct.usage (ns)"
	srcCgroupV2  cpuSource = "cgroup v2 cpu.stat usage_usec"
	srcSchedstat cpuSource = "/proc/PID/task/*/schedstat (ns)"
	srcTicks     cpuSource = "/proc/PID/stat (10 ms ticks)"
)

// cgroups holds the per-process cgroups of one run, under one parent named after the bench's
// PID so two runs on one machine do not mix.
type cgroups struct {
	root string // the parent folder; "" when cgroups are not usable
	v2   bool
}

// newCgroups finds a writable cpu-accounting hierarchy and makes the run's parent in it.
func newCgroups() *cgroups {
	name := fmt.Sprintf("sandbench-%d", os.Getpid())
	for _, c := range []struct {
		dir string
		v2  bool
	}{{"/sys/fs/cgroup/cpuacct", false}, {"/sys/fs/cgroup/cpu,cpuacct", false}, {"/sys/fs/cgroup", true}, {"/sys/fs/cgroup/unified", true}} {
		probe := "cpuacct.usage"
		if c.v2 {
			probe = "cpu.stat"
		}
		if _, err := os.Stat(filepath.Join(c.dir, probe)); err != nil {
			continue
		}
		dir := filepath.Join(c.dir, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, probe)); err != nil {
			_ = os.Remove(dir)
			continue
		}
		return &cgroups{root: dir, v2: c.v2}
	}
	return &cgroups{}
}

// attach moves pid into a cgroup of its own named name and returns it, or "" when cgroups are
// not usable (the meter then falls back to /proc).
func (g *cgroups) attach(name string, pid int) string {
	if g == nil || g.root == "" {
		return ""
	}
	dir := filepath.Join(g.root, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return ""
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return ""
	}
	return dir
}

// usage reads a cgroup's CPU time.
func (g *cgroups) usage(dir string) (time.Duration, error) {
	if !g.v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
		if err != nil {
			return 0, err
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(ns), err
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Duration(us) * time.Microsecond, err
		}
	}
	return 0, fmt.Errorf("%s/cpu.stat: no usage_usec", dir)
}

// source names what usage reads.
func (g *cgroups) source() cpuSource {
	if g.v2 {
		return srcCgroupV2
	}
	return srcCgroupV1
}

// remove deletes the run's cgroups (each is empty once its process exited). Best effort: a
// cgroup left behind holds no process and costs nothing.
func (g *cgroups) remove() {
	if g == nil || g.root == "" {
		return
	}
	ents, _ := os.ReadDir(g.root)
	for _, e := range ents {
		if e.IsDir() {
			_ = os.Remove(filepath.Join(g.root, e.Name()))
		}
	}
	_ = os.Remove(g.root)
}

// cpuMeter reads one process's (group's) CPU time.
type cpuMeter struct {
	pgid   int
	groups *cgroups
	cgroup string // "" without a cgroup
}

// Source names the meter's source.
func (m *cpuMeter) Source() cpuSource {
	if m.cgroup != "" {
		return m.groups.source()
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/schedstat", m.pgid)); err == nil && schedstatWorks() {
		return srcSchedstat
	}
	return srcTicks
}

// CPU is the meter's process (group) CPU time so far.
func (m *cpuMeter) CPU() (time.Duration, error) {
	if m.cgroup != "" {
		if d, err := m.groups.usage(m.cgroup); err == nil {
			return d, nil
		}
	}
	if schedstatWorks() {
		return groupSchedstat(m.pgid)
	}
	s, err := sampleGroup(m.pgid)
	return s.CPU, err
}

// schedstatWorks says whether this kernel keeps per-task run time in schedstat (it reads
// "0 0 0" where schedstats are compiled out).
func schedstatWorks() bool {
	ns, err := taskSchedstat(fmt.Sprintf("/proc/%d/schedstat", os.Getpid()))
	return err == nil && ns > 0
}

// groupSchedstat sums the run time of every thread of every process of group pgid.
func groupSchedstat(pgid int) (time.Duration, error) {
	var sum time.Duration
	found := false
	for _, pid := range groupPIDs(pgid) {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			continue
		}
		found = true
		for _, t := range tasks {
			if ns, err := taskSchedstat(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name())); err == nil {
				sum += time.Duration(ns)
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("no process in group %d", pgid)
	}
	return sum, nil
}

// taskSchedstat reads the first field of a schedstat file: nanoseconds on the CPU.
func taskSchedstat(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte(" "))
	return strconv.ParseInt(string(f), 10, 64)
}

// selfCPU is the load generator's own CPU time (getrusage: nanosecond run time, reported in
// microseconds).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
